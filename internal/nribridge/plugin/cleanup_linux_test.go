package plugin

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
	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/firewall"
	"github.com/knext-dev/knext/internal/nribridge/store"
	"github.com/knext-dev/knext/internal/nribridge/wiring"
)

func TestNetnsCleanup(t *testing.T) {
	requireRoot(t)
	doc, s := freeNetworkDoc(t)
	file := filepath.Join(t.TempDir(), "bridge.yaml")
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	flags := &config.Flags{File: file}
	p, err := newPlugin(flags)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.configure([]byte(doc)); err != nil {
		t.Fatal(err)
	}
	pod, _ := newNetns(t, "a")
	pod.PortMappings = []*api.PortMapping{mapping(api.Protocol_TCP, netnstest.Port(t), 80, "")}
	if err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	wantTable(t, s.Bridge, true)

	if err := Cleanup(flags, io.Discard); err == nil || !strings.Contains(err.Error(), "is locked by another process") {
		t.Errorf("cleanup while nri-bridge runs: got %v, want a refusal", err)
	}
	p.close()
	var out bytes.Buffer
	if err := Cleanup(flags, &out); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(s.StateDir, store.File)
	want := fmt.Sprintf("nri-bridge: removed %s of %s\nnri-bridge: removed nftables table inet %s\nnri-bridge: removed bridge %s\nnri-bridge: removed %s\nnri-bridge: removed %s\n",
		wiring.HostVethName(pod.Id), refOf(pod), firewall.TableName(s.Bridge), s.Bridge, db, s.StateDir)
	if out.String() != want {
		t.Errorf("cleanup said:\n%s\nwant:\n%s", out.String(), want)
	}
	wantTable(t, s.Bridge, false)
	for _, name := range []string{s.Bridge, wiring.HostVethName(pod.Id)} {
		if _, err := netlink.LinkByName(name); !errors.As(err, &netlink.LinkNotFoundError{}) {
			t.Errorf("interface %s after cleanup: %v", name, err)
		}
	}
	if _, err := os.Stat(s.StateDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state directory %s after cleanup: %v", s.StateDir, err)
	}
	if got := podState(t, pod); got != "lo up=true; no eth0" {
		t.Errorf("pod after cleanup: %s", got)
	}

	// Nothing left: nothing to do, no error.
	out.Reset()
	if err := Cleanup(flags, &out); err != nil || out.Len() != 0 {
		t.Errorf("second cleanup: %v, said %q", err, out.String())
	}
}
