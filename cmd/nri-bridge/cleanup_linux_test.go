package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/vishvananda/netlink"

	"github.com/knext-dev/knext/internal/netnstest"
)

func TestNetnsCleanup(t *testing.T) {
	requireRoot(t)
	doc, s := freeNetworkDoc(t)
	file := filepath.Join(t.TempDir(), "bridge.yaml")
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	flags := &configFlags{file: file}
	p := &plugin{flags: flags, newNetwork: newHostNetwork, newFirewall: newNFTFirewall}
	if err := p.configure([]byte(doc)); err != nil {
		t.Fatal(err)
	}
	pod, _ := newNetns(t, "a")
	pod.PortMappings = []*api.PortMapping{mapping(api.Protocol_TCP, netnstest.Port(t), 80, "")}
	if err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	wantTable(t, s.bridge, true)

	if err := cleanup(flags, io.Discard); err == nil || !strings.Contains(err.Error(), "is locked by another process") {
		t.Errorf("cleanup while nri-bridge runs: got %v, want a refusal", err)
	}
	p.close()
	var out bytes.Buffer
	if err := cleanup(flags, &out); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(s.stateDir, storeFile)
	want := fmt.Sprintf("nri-bridge: removed %s of %s\nnri-bridge: removed nftables table inet %s\nnri-bridge: removed bridge %s\nnri-bridge: removed %s\nnri-bridge: removed %s\n",
		hostVethName(pod.Id), refOf(pod), tableName(s.bridge), s.bridge, db, s.stateDir)
	if out.String() != want {
		t.Errorf("cleanup said:\n%s\nwant:\n%s", out.String(), want)
	}
	wantTable(t, s.bridge, false)
	for _, name := range []string{s.bridge, hostVethName(pod.Id)} {
		if _, err := netlink.LinkByName(name); !errors.As(err, &netlink.LinkNotFoundError{}) {
			t.Errorf("interface %s after cleanup: %v", name, err)
		}
	}
	if _, err := os.Stat(s.stateDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state directory %s after cleanup: %v", s.stateDir, err)
	}
	if got := podState(t, pod); got != "lo up=true; no eth0" {
		t.Errorf("pod after cleanup: %s", got)
	}

	// Nothing left: nothing to do, no error.
	out.Reset()
	if err := cleanup(flags, &out); err != nil || out.Len() != 0 {
		t.Errorf("second cleanup: %v, said %q", err, out.String())
	}
}
