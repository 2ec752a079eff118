package store

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/knext-dev/knext/internal/nribridge/hostport"
)

// hostPortsBucket maps a pod ID to the JSON PodHostPorts of a pod that publishes host ports.
// It is created by the first claim; stores written before hostPort support have none.
var hostPortsBucket = []byte("hostports")

// PodHostPorts are the host ports a pod holds.
type PodHostPorts struct {
	Pod   PodRef             `json:"pod"`
	Ports []hostport.Mapping `json:"ports"`
}

// ClaimHostPorts records the ports the pod publishes, unless another pod holds one of them;
// the error then names the port and its holder. created tells whether the pod held no ports
// before. The check and the record are one transaction: two pods never get the same port.
func (s *Store) ClaimHostPorts(pod PodRef, ports []hostport.Mapping) (created bool, err error) {
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
					if want.Overlaps(held) {
						return fmt.Errorf("%s is taken: %s holds %s", want, holder.Pod, held)
					}
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		value, err := json.Marshal(PodHostPorts{Pod: pod, Ports: ports})
		if err != nil {
			return err
		}
		return bucket.Put([]byte(pod.ID), value)
	})
	return created, err
}

// HostPortsOf returns the ports the pod holds, nil if none.
func (s *Store) HostPortsOf(podID string) (*PodHostPorts, error) {
	var held *PodHostPorts
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

// AllHostPorts returns the ports of every pod, by pod ID.
func (s *Store) AllHostPorts() (map[string]*PodHostPorts, error) {
	all := map[string]*PodHostPorts{}
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

// ReleaseHostPorts forgets the pod's ports; releasing twice is no error.
func (s *Store) ReleaseHostPorts(podID string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		bucket := tx.Bucket(hostPortsBucket)
		if bucket == nil {
			return nil
		}
		return bucket.Delete([]byte(podID))
	})
}

func decodeHostPorts(key, value []byte) (*PodHostPorts, error) {
	held := &PodHostPorts{}
	if err := json.Unmarshal(value, held); err != nil {
		return nil, fmt.Errorf("allocation store: corrupt host ports of sandbox %s: %w", key, err)
	}
	return held, nil
}
