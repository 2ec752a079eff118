package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	nribridge "github.com/knext-dev/knext/deploy/nri-bridge"
	"github.com/knext-dev/knext/internal/ociimage"
	"github.com/knext-dev/knext/internal/stack"
)

// releaseFiles is the content of the release tarball (deploy/release/release.sh).
var releaseFiles = []string{
	"bin/containerd", "bin/containerd-shim-runc-v2", "bin/ctr", "bin/nri-bridge",
	"lib/systemd/system/containerd.service", "lib/systemd/system/nri-bridge.service",
	"share/doc/knext/cni-less.md", "share/doc/knext/configuration.md", "share/doc/knext/release.md",
	"share/knext/config.toml", "share/knext/images/nri-bridge.tar",
	"share/knext/nri-bridge/bridge.conf", "share/knext/nri-bridge/daemonset.yaml", "share/knext/nri-bridge/static-pod.yaml",
}

var demoBinary onceBuild

// The release tarball of `make release` checks out against its checksum file, holds what it
// should, names one version everywhere, and works: unpacked into a temporary root, its binaries
// run the demo (cmd/knext-demo) with its nri-bridge.
func TestReleaseTarballRunsTheDemo(t *testing.T) {
	t.Parallel()
	tarball := os.Getenv("KNEXT_RELEASE")
	if tarball == "" {
		t.Fatal("KNEXT_RELEASE is not set: run the tests through make (make release writes the tarball)")
	}
	data, err := os.ReadFile(tarball)
	if err != nil {
		t.Fatalf("%v (make release writes it)", err)
	}
	sum := sha256.Sum256(data)
	checksum, err := os.ReadFile(tarball + ".sha256sum")
	if err != nil {
		t.Fatal(err)
	}
	if want := hex.EncodeToString(sum[:]) + "  " + filepath.Base(tarball) + "\n"; string(checksum) != want {
		t.Errorf("%s.sha256sum holds %q, want %q", filepath.Base(tarball), checksum, want)
	}

	root, err := os.MkdirTemp("", "knext-release-") //nolint:usetesting // a short path: the demo's sockets live under it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if out, err := exec.Command("tar", "-C", root, "-xzf", tarball).CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v\n%s", tarball, err, out)
	}
	var files []string
	if err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, strings.TrimPrefix(path, root+"/"))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(files, releaseFiles) {
		t.Fatalf("the tarball holds %v, want %v", files, releaseFiles)
	}

	// One version: the file name's tag, the daemon's version, the image's tag, the manifests' image.
	tag := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(tarball), "knext-"), "-linux-"+runtime.GOARCH+".tar.gz")
	// Tags and file names have a '-' where the version has its '+' (the Makefile's TAG).
	version := strings.Replace(tag, "-knext.", "+knext.", 1)
	versionOutput, err := exec.Command(filepath.Join(root, "bin", "containerd"), "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(versionOutput), " "+version+" ") {
		t.Errorf("bin/containerd --version says %q, the tarball is release %s", versionOutput, tag)
	}
	image, err := ociimage.ImageName(filepath.Join(root, "share/knext/images/nri-bridge.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if image != ociimage.NRIBridgeRepository+":"+tag {
		t.Errorf("the image archive holds %s, the tarball is release %s", image, tag)
	}
	var pod corev1.Pod
	data, err = os.ReadFile(filepath.Join(root, "share/knext/nri-bridge/static-pod.yaml"))
	if err == nil {
		err = yaml.UnmarshalStrict(data, &pod)
	}
	if err != nil {
		t.Fatalf("static-pod.yaml: %v", err)
	}
	data, err = os.ReadFile(filepath.Join(root, "share/knext/nri-bridge/daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := nribridge.ParseClusterNetwork(data)
	if err != nil {
		t.Fatalf("daemonset.yaml: %v", err)
	}
	if dsImage := cluster.DaemonSet.Spec.Template.Spec.Containers[0].Image; pod.Spec.Containers[0].Image != image || dsImage != image {
		t.Errorf("the manifests run %s and %s, the release's image is %s", pod.Spec.Containers[0].Image, dsImage, image)
	}
	unit, err := os.ReadFile(filepath.Join(root, "lib/systemd/system/containerd.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "\nExecStart=/usr/local/bin/containerd\n") {
		t.Errorf("containerd.service does not run the tarball's bin/containerd installed in /usr/local:\n%s", unit)
	}

	bridgeUnit, err := os.ReadFile(filepath.Join(root, "lib/systemd/system/nri-bridge.service"))
	if err != nil {
		t.Fatal(err)
	}
	wantBridgeUnitOrdering(t, unitDirectives(string(bridgeUnit)))

	wantNRISocketRootOnly(t, root, unitDirectives(string(unit)))
	wantConfigAccepted(t, filepath.Join(root, "bin", "containerd"), filepath.Join(root, "share/knext/config.toml"))
	wantConfigVersion(t, filepath.Join(root, "bin", "containerd"), filepath.Join(root, "share/knext/config.toml"))

	demo := demoBinary.get(t, func(dir string) (string, error) {
		path := filepath.Join(dir, "knext-demo")
		_, err := goCommand(nil, "build", "-o", path, "github.com/knext-dev/knext/cmd/knext-demo")
		return path, err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, demo, "-root", filepath.Join(root, "demo"), "-nri-bridge", filepath.Join(root, "bin", "nri-bridge"))
	cmd.Env = append(os.Environ(), "KNEXT_BIN_DIR="+filepath.Join(root, "bin"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the demo on the release's binaries failed: %v\n%s", err, out)
	}
	for _, want := range []string{"containerd " + version + " is up", `"source": "nri:` + nriBridgeName + `"`, " 0% packet loss"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("the demo's output lacks %q:\n%s", want, out)
		}
	}
}

// wantConfigAccepted checks that containerd reads the example configuration with every option
// it sets: `config dump` shows the example's values under the same keys (a misspelled key is
// dropped, not kept).
func wantConfigAccepted(t *testing.T, containerd, config string) {
	t.Helper()
	dump, err := exec.Command(containerd, "--config", config, "config", "dump").Output()
	if err != nil {
		t.Fatalf("containerd config dump of %s: %v", config, err)
	}
	var example, dumped map[string]any
	data, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := toml.Unmarshal(data, &example); err != nil {
		t.Fatalf("%s: %v", config, err)
	}
	if err := toml.Unmarshal(dump, &dumped); err != nil {
		t.Fatalf("containerd config dump: %v\n%s", err, dump)
	}
	var walk func(prefix string, example, dumped map[string]any)
	walk = func(prefix string, example, dumped map[string]any) {
		for key, value := range example {
			if table, ok := value.(map[string]any); ok {
				sub, _ := dumped[key].(map[string]any)
				walk(prefix+key+".", table, sub)
				continue
			}
			if got, ok := dumped[key]; !ok || !reflect.DeepEqual(got, value) {
				t.Errorf("example config %s = %v: containerd reads %v", prefix+key, value, got)
			}
		}
	}
	walk("", example, dumped)
}

// unitDirectives reads a systemd unit file: section, then key, then every value given to the key
// (a list such as After= may be split over lines and values).
func unitDirectives(unit string) map[string]map[string][]string {
	sections := map[string]map[string][]string{}
	section := ""
	for line := range strings.SplitSeq(unit, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			if sections[section] == nil {
				sections[section] = map[string][]string{}
			}
		default:
			key, value, ok := strings.Cut(line, "=")
			if ok && section != "" {
				sections[section][key] = append(sections[section][key], strings.Fields(value)...)
			}
		}
	}
	return sections
}

// wantBridgeUnitOrdering checks what containerd.service promises of nri-bridge.service: it runs
// the tarball's nri-bridge, is ordered after containerd and pulls it in, and is not bound to it
// (nri-bridge reconnects after a restart of containerd; Requires= or BindsTo= would stop or
// restart it with containerd).
func wantBridgeUnitOrdering(t *testing.T, unit map[string]map[string][]string) {
	t.Helper()
	if got := unit["Service"]["ExecStart"]; len(got) == 0 || got[0] != "/usr/local/bin/nri-bridge" {
		t.Errorf("nri-bridge.service runs %v, not the tarball's bin/nri-bridge installed in /usr/local", got)
	}
	for _, key := range []string{"After", "Wants"} {
		if !slices.Contains(unit["Unit"][key], "containerd.service") {
			t.Errorf("nri-bridge.service: %s= is %v, without containerd.service", key, unit["Unit"][key])
		}
	}
	for _, key := range []string{"Requires", "BindsTo", "PartOf"} {
		if slices.Contains(unit["Unit"][key], "containerd.service") {
			t.Errorf("nri-bridge.service: %s=containerd.service would stop it with containerd, which it outlives", key)
		}
	}
}

// wantConfigVersion checks that the example configuration has the version the release's
// containerd writes itself (`containerd config default`), so that it is read as written, not
// migrated from an older version.
func wantConfigVersion(t *testing.T, containerd, config string) {
	t.Helper()
	defaults, err := exec.Command(containerd, "config", "default").Output()
	if err != nil {
		t.Fatalf("containerd config default: %v", err)
	}
	var want, got struct {
		Version int `toml:"version"`
	}
	if err := toml.Unmarshal(defaults, &want); err != nil {
		t.Fatalf("containerd config default: %v\n%s", err, defaults)
	}
	data, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := toml.Unmarshal(data, &got); err != nil {
		t.Fatalf("%s: %v", config, err)
	}
	if want.Version == 0 || got.Version != want.Version {
		t.Errorf("%s has version = %d; the release's containerd writes version = %d", filepath.Base(config), got.Version, want.Version)
	}
}

// wantNRISocketRootOnly starts the release's containerd with its example configuration, every
// path in it moved under root, with the umask its unit gives it, and checks that the NRI socket
// and its directory are writable by root only and that another user cannot connect: whoever
// connects to the socket can run programs as root on the node and claim pods' IPs.
func wantNRISocketRootOnly(t *testing.T, root string, unit map[string]map[string][]string) {
	t.Helper()
	umask := unit["Service"]["UMask"]
	if len(umask) != 1 {
		t.Fatalf("containerd.service: UMask= is %v, want the one the NRI socket's mode depends on", umask)
	}
	data, err := os.ReadFile(filepath.Join(root, "share/knext/config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	var config map[string]any
	if err := toml.Unmarshal(data, &config); err != nil {
		t.Fatalf("config.toml: %v", err)
	}
	// As on a node, the socket's directory does not exist before containerd starts (/run is a
	// fresh tmpfs at boot), and the directories above it are open to everyone.
	run := filepath.Join(root, "run")
	for _, dir := range []string{root, run} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	config["root"], config["state"] = filepath.Join(root, "var-lib"), filepath.Join(run, "containerd")
	plugins := config["plugins"].(map[string]any)
	table := func(name string) map[string]any {
		if plugins[name] == nil {
			plugins[name] = map[string]any{}
		}
		return plugins[name].(map[string]any)
	}
	nri := table("io.containerd.nri.v1.nri")
	if nri["socket_path"] != "/var/run/nri/nri.sock" {
		t.Fatalf("config.toml: NRI's socket_path is %v, not the /var/run/nri/nri.sock of nri-bridge's manifests", nri["socket_path"])
	}
	nriSocket := filepath.Join(run, "nri", "nri.sock")
	nri["socket_path"], nri["plugin_path"], nri["plugin_config_path"] = nriSocket, filepath.Join(root, "nri-plugins"), filepath.Join(root, "nri-conf.d")
	grpcSocket := filepath.Join(run, "containerd", "containerd.sock")
	table("io.containerd.server.v1.grpc")["address"] = grpcSocket
	table("io.containerd.server.v1.ttrpc")["address"] = grpcSocket + ".ttrpc"
	table("io.containerd.internal.v1.opt")["path"] = filepath.Join(root, "opt")
	cni := table("io.containerd.cri.v1.runtime")["cni"].(map[string]any)
	cni["conf_dir"], cni["bin_dirs"] = filepath.Join(root, "etc-cni"), []string{filepath.Join(root, "cni-bin")}
	data, err = toml.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	configPath := filepath.Join(root, "config-under-root.toml")
	if err := os.WriteFile(configPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(root, "containerd.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command("/bin/sh", "-c", `umask "$0" && exec "$@"`, umask[0], filepath.Join(root, "bin", "containerd"), "--config", configPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // Wait says how it ended
		cmd.Wait()                          //nolint:errcheck // terminated
	}()
	if err := stack.Poll(context.Background(), time.Minute, 100*time.Millisecond, func() error {
		_, err := os.Stat(nriSocket)
		return err
	}); err != nil {
		t.Fatalf("the release's containerd made no NRI socket: %v\n%s", err, stack.Tail(logPath, 30, nil))
	}
	for _, path := range []string{filepath.Dir(nriSocket), nriSocket} {
		wantWritableByRootOnly(t, path)
	}
	// Any other user, here nobody, is refused.
	ctr := exec.Command(filepath.Join(root, "bin", "ctr"), "--address", nriSocket, "--timeout", "10s", "version")
	ctr.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, err := ctr.CombinedOutput(); err == nil || !strings.Contains(string(out), "permission denied") {
		t.Errorf("user nobody connecting to the NRI socket %s: %v, %s; want permission denied", nriSocket, err, out)
	}
}

// wantWritableByRootOnly checks that path belongs to root and that neither its group nor others
// may write it.
func wantWritableByRootOnly(t *testing.T, path string) {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	stat := info.Sys().(*syscall.Stat_t)
	if stat.Uid != 0 || info.Mode().Perm()&0o022 != 0 {
		t.Errorf("%s: owner %d, mode %s; want root's and writable by root only", path, stat.Uid, info.Mode())
	}
}
