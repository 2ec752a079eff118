package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
)

// cleanup removes what nri-bridge created on the host for a configuration, for an uninstall:
// the host veths of the pods it still has allocations for (those pods lose their network), its
// nftables table, its bridge, and its allocation store (then the state directory, if empty).
// It refuses to run while an nri-bridge uses the store. Sysctls it turned on (forwarding) stay.
// Running it again, or on a node where nothing is left, changes nothing.
func cleanup(flags *configFlags, out io.Writer) error {
	p, err := newPlugin(flags)
	if err != nil {
		return err
	}
	cfg, err := resolveConfig(p.startupYAML, flags)
	if err != nil {
		return err
	}
	s, err := cfg.validate()
	if err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}

	dbPath := filepath.Join(s.stateDir, storeFile)
	if _, err := os.Stat(dbPath); err == nil {
		st, err := openStore(s.stateDir, s.pools)
		if err != nil {
			return err // locked: nri-bridge still runs
		}
		allocs, err := st.list()
		if err == nil {
			network := &bridgeNetwork{settings: s}
			for _, alloc := range allocs {
				if err = network.teardown(alloc); err != nil {
					break
				}
				fmt.Fprintf(out, "nri-bridge: removed %s of %s\n", alloc.HostVeth, alloc.Pod)
			}
		}
		if closeErr := st.close(); err != nil || closeErr != nil {
			return errors.Join(err, closeErr)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("allocation store: %w", err)
	}

	if exists, err := tableExists(s.bridge); err != nil {
		return err
	} else if exists {
		if err := deleteTable(s.bridge); err != nil {
			return err
		}
		fmt.Fprintf(out, "nri-bridge: removed nftables table inet %s\n", tableName(s.bridge))
	}

	link, err := netlink.LinkByName(s.bridge)
	switch {
	case errors.As(err, &netlink.LinkNotFoundError{}):
	case err != nil:
		return fmt.Errorf("bridge %s: %w", s.bridge, err)
	case link.Type() != "bridge":
		return fmt.Errorf("bridge %s: the existing interface is a %s, not a bridge: left alone", s.bridge, link.Type())
	default:
		if err := netlink.LinkDel(link); err != nil {
			return fmt.Errorf("deleting bridge %s: %w", s.bridge, err)
		}
		fmt.Fprintf(out, "nri-bridge: removed bridge %s\n", s.bridge)
	}

	if err := os.Remove(dbPath); err == nil {
		fmt.Fprintf(out, "nri-bridge: removed %s\n", dbPath)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Remove(s.stateDir); err == nil {
		fmt.Fprintf(out, "nri-bridge: removed %s\n", s.stateDir)
	}
	return nil
}
