package plugin

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/firewall"
	"github.com/knext-dev/knext/internal/nribridge/store"
	"github.com/knext-dev/knext/internal/nribridge/wiring"
)

// Cleanup removes what nri-bridge created on the host for a configuration, for an uninstall:
// the host veths of the pods it still has allocations for (those pods lose their network), its
// nftables table, its bridge, and its allocation store (then the state directory, if empty).
// It refuses to run while an nri-bridge uses the store. Sysctls it turned on (forwarding) stay.
// Running it again, or on a node where nothing is left, changes nothing.
func Cleanup(flags *config.Flags, out io.Writer) error {
	p, err := newPlugin(flags)
	if err != nil {
		return err
	}
	s, err := config.Load(p.startupYAML, flags)
	if err != nil {
		return err
	}

	dbPath := filepath.Join(s.StateDir, store.File)
	if _, err := os.Stat(dbPath); err == nil {
		st, err := store.Open(s.StateDir)
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
		if closeErr := st.Close(); err != nil || closeErr != nil {
			return errors.Join(err, closeErr)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("allocation store: %w", err)
	}

	if exists, err := firewall.TableExists(s.Bridge); err != nil {
		return err
	} else if exists {
		if err := firewall.DeleteTable(s.Bridge); err != nil {
			return err
		}
		fmt.Fprintf(out, "nri-bridge: removed nftables table inet %s\n", firewall.TableName(s.Bridge))
	}

	if deleted, err := wiring.DeleteBridge(s.Bridge); err != nil {
		return err
	} else if deleted {
		fmt.Fprintf(out, "nri-bridge: removed bridge %s\n", s.Bridge)
	}

	if err := os.Remove(dbPath); err == nil {
		fmt.Fprintf(out, "nri-bridge: removed %s\n", dbPath)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Remove(s.StateDir); err == nil {
		fmt.Fprintf(out, "nri-bridge: removed %s\n", s.StateDir)
	}
	return nil
}
