// Package store is nri-bridge's database (bbolt, in the state directory): the pods' address
// allocations and the hostPorts they hold.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/knext-dev/knext/internal/nribridge/config"
)

// PodRef identifies a pod in the store and in messages.
type PodRef struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	UID       string `json:"uid,omitempty"`
}

func (p PodRef) String() string {
	return fmt.Sprintf("pod %s/%s (sandbox %s)", p.Namespace, p.Name, p.ID)
}

// Allocation is what the plugin owns for one pod. It is persisted before the pod's netns is
// touched, so that every veth and address the plugin may have created is found again after a
// crash.
type Allocation struct {
	Pod      PodRef `json:"pod"`
	NetNS    string `json:"netns"`
	HostVeth string `json:"hostVeth"`
	// Addrs are the pod's addresses with their subnet length, in pool order (IPv4 first).
	Addrs []netip.Prefix `json:"addrs"`
}

var (
	podsBucket    = []byte("pods")    // pod ID -> JSON allocation
	addrsBucket   = []byte("addrs")   // address -> pod ID
	cursorsBucket = []byte("cursors") // family -> last address handed out
)

// Store is the IP address manager: a bbolt database, so an allocation is on disk (fsync'ed)
// when Allocate returns and concurrent allocations are serialized by bbolt's write lock.
type Store struct {
	db  *bolt.DB
	dir string
}

// File is the database's file in the state directory.
const File = "allocations.db"

// Open opens (creating if needed) the database in dir. bbolt locks the file, so a second
// nri-bridge on the same state directory fails here instead of handing out duplicates.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	path := filepath.Join(dir, File)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("allocation store %s is locked by another process (another nri-bridge with the same stateDir?)", path)
		}
		return nil, fmt.Errorf("allocation store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{podsBucket, addrsBucket, cursorsBucket} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("allocation store %s: %w", path, err)
	}
	return &Store{db: db, dir: dir}, nil
}

// Dir is the state directory the database is in.
func (s *Store) Dir() string {
	return s.dir
}

// Close closes the database.
func (s *Store) Close() error {
	return s.db.Close()
}

// Allocate returns the pod's allocation, creating it with one address of each of pools if the pod
// has none (created tells which). Either every pool gives an address or nothing is stored.
func (s *Store) Allocate(pools []config.Pool, pod PodRef, netns, hostVeth string) (alloc *Allocation, created bool, err error) {
	err = s.db.Update(func(tx *bolt.Tx) error {
		var err error
		if alloc, err = getAllocation(tx, pod.ID); err != nil || alloc != nil {
			return err
		}
		created = true
		alloc = &Allocation{Pod: pod, NetNS: netns, HostVeth: hostVeth}
		addrs, cursors := tx.Bucket(addrsBucket), tx.Bucket(cursorsBucket)
		for _, p := range pools {
			addr, err := nextFree(addrs, cursors, p)
			if err != nil {
				return err
			}
			if err := addrs.Put([]byte(addr.String()), []byte(pod.ID)); err != nil {
				return err
			}
			if err := cursors.Put([]byte(p.Family), []byte(addr.String())); err != nil {
				return err
			}
			alloc.Addrs = append(alloc.Addrs, netip.PrefixFrom(addr, p.Subnet.Bits()))
		}
		return putAllocation(tx, alloc)
	})
	if err != nil {
		return nil, false, err
	}
	return alloc, created, nil
}

// nextFree hands out addresses round-robin from the last one handed out, so that a released
// address is reused as late as possible (stale ARP/neighbour and conntrack entries age out).
func nextFree(addrs, cursors *bolt.Bucket, p config.Pool) (netip.Addr, error) {
	start := p.Subnet.Addr()
	if last, err := netip.ParseAddr(string(cursors.Get([]byte(p.Family)))); err == nil && p.Subnet.Contains(last) {
		start = last
	}
	for addr := advance(p.Subnet, start); ; addr = advance(p.Subnet, addr) {
		if !p.Reserved(addr) && addrs.Get([]byte(addr.String())) == nil {
			return addr, nil
		}
		if addr == start {
			return netip.Addr{}, &PoolExhaustedError{Pool: p}
		}
	}
}

// PoolExhaustedError says that a pool has no free address.
type PoolExhaustedError struct{ Pool config.Pool }

func (e *PoolExhaustedError) Error() string {
	return fmt.Sprintf("no free %s address in %s", e.Pool.Family, e.Pool.Subnet)
}

// advance returns the address after addr in subnet, wrapping around at the end.
func advance(subnet netip.Prefix, addr netip.Addr) netip.Addr {
	if next := addr.Next(); next.IsValid() && subnet.Contains(next) {
		return next
	}
	return subnet.Addr()
}

// Get returns the pod's allocation, nil if it has none.
func (s *Store) Get(podID string) (*Allocation, error) {
	var alloc *Allocation
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		alloc, err = getAllocation(tx, podID)
		return err
	})
	return alloc, err
}

// Release forgets the pod's allocation and frees its addresses; releasing twice is no error.
func (s *Store) Release(podID string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		alloc, err := getAllocation(tx, podID)
		if err != nil || alloc == nil {
			return err
		}
		addrs := tx.Bucket(addrsBucket)
		for _, addr := range alloc.Addrs {
			// Only free an address this pod holds, whatever the database says.
			key := []byte(addr.Addr().String())
			if string(addrs.Get(key)) == podID {
				if err := addrs.Delete(key); err != nil {
					return err
				}
			}
		}
		return tx.Bucket(podsBucket).Delete([]byte(podID))
	})
}

// List returns every allocation.
func (s *Store) List() ([]*Allocation, error) {
	var allocs []*Allocation
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(podsBucket).ForEach(func(k, v []byte) error {
			alloc, err := decodeAllocation(k, v)
			if err != nil {
				return err
			}
			allocs = append(allocs, alloc)
			return nil
		})
	})
	return allocs, err
}

func getAllocation(tx *bolt.Tx, podID string) (*Allocation, error) {
	v := tx.Bucket(podsBucket).Get([]byte(podID))
	if v == nil {
		return nil, nil
	}
	return decodeAllocation([]byte(podID), v)
}

func decodeAllocation(key, value []byte) (*Allocation, error) {
	alloc := &Allocation{}
	if err := json.Unmarshal(value, alloc); err != nil {
		return nil, fmt.Errorf("allocation store: corrupt record for sandbox %s: %w", key, err)
	}
	return alloc, nil
}

func putAllocation(tx *bolt.Tx, alloc *Allocation) error {
	value, err := json.Marshal(alloc)
	if err != nil {
		return err
	}
	return tx.Bucket(podsBucket).Put([]byte(alloc.Pod.ID), value)
}
