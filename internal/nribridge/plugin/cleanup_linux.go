package plugin

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"

	"github.com/knext-dev/knext/internal/nribridge/cluster"
	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/firewall"
	"github.com/knext-dev/knext/internal/nribridge/store"
	"github.com/knext-dev/knext/internal/nribridge/wiring"
)

// Cleanup removes what nri-bridge created on the host for a configuration, for an uninstall:
// the host veths of the pods it still has allocations for (those pods lose their network), the
// routes to other nodes it made in cluster mode, its nftables table, its bridge, and its
// allocation store (then the state directory, if empty).
// It refuses to run while an nri-bridge uses the store. Sysctls it turned on (forwarding) stay.
// Running it again, or on a node where nothing is left, changes nothing.
func Cleanup(flags *config.Flags, out io.Writer) error {
	p, err := newPlugin(flags)
	if err != nil {
		return err
	}
	cfg, err := config.Resolve(p.startupYAML, flags)
	if err != nil {
		return err
	}
	// The bridge and the state directory name what there is to remove: a configuration of
	// either mode will do.
	if _, err := cfg.Validate(); err != nil && cfg.CheckCluster() != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	bridge, stateDir := cfg.Bridge, cfg.StateDir

	dbPath := filepath.Join(stateDir, store.File)
	if _, err := os.Stat(dbPath); err == nil {
		st, err := store.Open(stateDir)
		if err != nil {
			return err // locked: nri-bridge still runs
		}
		allocs, err := st.List()
		if err == nil {
			for _, alloc := range allocs {
				if err = wiring.DeleteHostVeth(alloc.HostVeth); err != nil {
					break
				}
				fmt.Fprintf(out, "nri-bridge: removed %s of %s\n", alloc.HostVeth, alloc.Pod)
			}
		}
		if err == nil {
			err = removeRoutes(st, out)
		}
		if closeErr := st.Close(); err != nil || closeErr != nil {
			return errors.Join(err, closeErr)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("allocation store: %w", err)
	}

	if exists, err := firewall.TableExists(bridge); err != nil {
		return err
	} else if exists {
		if err := firewall.DeleteTable(bridge); err != nil {
			return err
		}
		fmt.Fprintf(out, "nri-bridge: removed nftables table inet %s\n", firewall.TableName(bridge))
	}

	if deleted, err := wiring.DeleteBridge(bridge); err != nil {
		return err
	} else if deleted {
		fmt.Fprintf(out, "nri-bridge: removed bridge %s\n", bridge)
	}

	if err := os.Remove(dbPath); err == nil {
		fmt.Fprintf(out, "nri-bridge: removed %s\n", dbPath)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Remove(stateDir); err == nil {
		fmt.Fprintf(out, "nri-bridge: removed %s\n", stateDir)
	}
	return nil
}

// removeRoutes removes the routes to other nodes that the store says nri-bridge made.
func removeRoutes(st *store.Store, out io.Writer) error {
	state, err := st.ClusterState()
	if err != nil || state == nil {
		return err
	}
	routes := cluster.NewNetlinkRoutes(&netlink.Handle{})
	for _, r := range state.Routes {
		if err := routes.Delete(r); err != nil {
			return err
		}
		fmt.Fprintf(out, "nri-bridge: removed route %s\n", r)
	}
	return nil
}
