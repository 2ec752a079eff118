package store

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	bolt "go.etcd.io/bbolt"
)

// clusterBucket holds the last known cluster state (cluster mode) under clusterKey. It is
// created by the first write; stores of nodes that never ran in cluster mode have none.
var (
	clusterBucket = []byte("cluster")
	clusterKey    = []byte("state")
)

// ClusterState is what nri-bridge last knew of its cluster, so that it keeps networking the node
// while the API server is unreachable: the node's own pod subnets, the other nodes, and the
// routes it made to them.
type ClusterState struct {
	// Node is this node's name; PodCIDRs are its spec.podCIDRs.
	Node     string         `json:"node"`
	PodCIDRs []netip.Prefix `json:"podCIDRs,omitempty"`
	// Nodes are the other nodes.
	Nodes []Node `json:"nodes,omitempty"`
	// Routes are the routes nri-bridge made (or was about to make) to the other nodes' pod
	// CIDRs: the only routes it ever removes.
	Routes []Route `json:"routes,omitempty"`
	// Updated is when the state last changed.
	Updated time.Time `json:"updated"`
}

// Node is another node of the cluster as its Node object describes it.
type Node struct {
	Name        string         `json:"name"`
	PodCIDRs    []netip.Prefix `json:"podCIDRs,omitempty"`
	InternalIPs []netip.Addr   `json:"internalIPs,omitempty"`
}

// Route is a route to another node's pod CIDR through that node's address.
type Route struct {
	Node string       `json:"node"`
	Dst  netip.Prefix `json:"dst"`
	Gw   netip.Addr   `json:"gw"`
}

func (r Route) String() string {
	return fmt.Sprintf("%s via %s (node %s)", r.Dst, r.Gw, r.Node)
}

// ClusterState returns the last known cluster state, nil if there is none.
func (s *Store) ClusterState() (*ClusterState, error) {
	var state *ClusterState
	err := s.db.View(func(tx *bolt.Tx) error {
		bucket := tx.Bucket(clusterBucket)
		if bucket == nil {
			return nil
		}
		value := bucket.Get(clusterKey)
		if value == nil {
			return nil
		}
		state = &ClusterState{}
		if err := json.Unmarshal(value, state); err != nil {
			return fmt.Errorf("allocation store: corrupt cluster state: %w", err)
		}
		return nil
	})
	return state, err
}

// PutClusterState replaces the last known cluster state.
func (s *Store) PutClusterState(state *ClusterState) error {
	value, err := json.Marshal(state)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		bucket, err := tx.CreateBucketIfNotExists(clusterBucket)
		if err != nil {
			return err
		}
		return bucket.Put(clusterKey, value)
	})
}
