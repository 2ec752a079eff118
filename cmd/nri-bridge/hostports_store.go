package main

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// hostPortsBucket maps a pod ID to the JSON podHostPorts of a pod that publishes host ports.
// It is created by the first claim; stores written before hostPort support have none.
var hostPortsBucket = []byte("hostports")

// podHostPorts are the host ports a pod holds.
type podHostPorts struct {
	Pod   podRef        `json:"pod"`
	Ports []portMapping `json:"ports"`
}

// claimHostPorts records the ports the pod publishes, unless another pod holds one of them;
// the error then names the port and its holder. created tells whether the pod held no ports
// before. The check and the record are one transaction: two pods never get the same port.
func (s *store) claimHostPorts(pod podRef, ports []portMapping) (created bool, err error) {
	err = s.db.Update(func(tx *bolt.Tx) error {
		bucket, err := tx.CreateBucketIfNotExists(hostPortsBucket)
		if err != nil {
			return err
		}
		created = bucket.Get([]byte(pod.ID)) == nil
		err = bucket.ForEach(func(k, v []byte) error {
			if string(k) == pod.ID {
				return nil
			}
			holder, err := decodeHostPorts(k, v)
			if err != nil {
				return err
			}
			for _, want := range ports {
				for _, held := range holder.Ports {
					if want.overlaps(held) {
						return fmt.Errorf("%s is taken: %s holds %s", want, holder.Pod, held)
					}
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		value, err := json.Marshal(podHostPorts{Pod: pod, Ports: ports})
		if err != nil {
			return err
		}
		return bucket.Put([]byte(pod.ID), value)
	})
	return created, err
}

// hostPortsOf returns the ports the pod holds, nil if none.
func (s *store) hostPortsOf(podID string) (*podHostPorts, error) {
	var held *podHostPorts
	err := s.db.View(func(tx *bolt.Tx) error {
		bucket := tx.Bucket(hostPortsBucket)
		if bucket == nil {
			return nil
		}
		v := bucket.Get([]byte(podID))
		if v == nil {
			return nil
		}
		var err error
		held, err = decodeHostPorts([]byte(podID), v)
		return err
	})
	return held, err
}

// allHostPorts returns the ports of every pod, by pod ID.
func (s *store) allHostPorts() (map[string]*podHostPorts, error) {
	all := map[string]*podHostPorts{}
	err := s.db.View(func(tx *bolt.Tx) error {
		bucket := tx.Bucket(hostPortsBucket)
		if bucket == nil {
			return nil
		}
		return bucket.ForEach(func(k, v []byte) error {
			held, err := decodeHostPorts(k, v)
			if err == nil {
				all[string(k)] = held
			}
			return err
		})
	})
	return all, err
}

// releaseHostPorts forgets the pod's ports; releasing twice is no error.
func (s *store) releaseHostPorts(podID string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		bucket := tx.Bucket(hostPortsBucket)
		if bucket == nil {
			return nil
		}
		return bucket.Delete([]byte(podID))
	})
}

func decodeHostPorts(key, value []byte) (*podHostPorts, error) {
	held := &podHostPorts{}
	if err := json.Unmarshal(value, held); err != nil {
		return nil, fmt.Errorf("allocation store: corrupt host ports of sandbox %s: %w", key, err)
	}
	return held, nil
}
