// Package critestimages rebuilds, from local inputs, every image the CRI validation suite
// (critest, sigs.k8s.io/cri-tools v1.37.0) pulls, under the references critest uses, so that a
// local registry can serve them where no registry is reachable. docs/conformance.md says what
// critest checks of each image.
//
// All but the pause images share one base layer modelled on the busybox image critest expects:
// Debian's dynamically linked busybox (package busybox) as /bin/busybox with the shared libraries
// it needs (package libc6), every applet a hard link in /bin, the busybox image's users and
// groups. Dynamic, because Debian's static busybox runs applets inside `sh` without exec
// (FEATURE_SH_STANDALONE), so a masked /bin/ls would still run; hard links, because masking a
// symlink masks its target, /bin/busybox, and with it every command. Debian's busybox has no
// pgrep and no ipcs: small shell versions stand in.
//
// Every time is Epoch (package ociimage), so the same inputs always give the same archive, byte
// for byte.
package critestimages

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/knext-dev/knext/internal/ociimage"
)

// Inputs are the binaries the images are made of.
type Inputs struct {
	// Busybox is a dynamically linked busybox (Debian package busybox).
	Busybox string
	// Pause, FakeNginx and NoNewPrivs are static executables built from internal/ociimage/pause,
	// internal/conformance/fakenginx and internal/conformance/nnp.
	Pause, FakeNginx, NoNewPrivs string
}

const (
	e2eImages     = "registry.k8s.io/e2e-test-images/"
	criToolsImage = "gcr.io/k8s-staging-cri-tools/"

	// DigestPinnedImage is the one image critest pulls that cannot be rebuilt: its reference pins
	// the digest of the upstream manifest.
	DigestPinnedImage = criToolsImage + "test-image-digest@sha256:9700f9a2f5bf2c45f2f605a0bd3bce7cf37420ec9d3ed50ac2758413308766bf"
	// SandboxImage is the pause image to pin as the CRI sandbox image.
	SandboxImage = "registry.k8s.io/pause:3.10"
)

// passwd and group are those of the busybox image critest's and containerd's tests were written
// against.
const (
	passwd = `root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
`
	group = `root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
lp:x:7:
mail:x:8:
kmem:x:9:
wheel:x:10:root
cdrom:x:11:
dialout:x:18:
floppy:x:19:
video:x:28:
audio:x:29:
tape:x:32:
www-data:x:33:
operator:x:37:
utmp:x:43:
plugdev:x:46:
staff:x:50:
lock:x:54:
netdev:x:82:
users:x:100:
nogroup:x:65534:
`

	// pgrep matches like procps' pgrep without options: an extended regular expression
	// anywhere in the process name.
	pgrep = `#!/bin/sh
# pgrep PATTERN: the PIDs of the processes whose name matches PATTERN (Debian's busybox has none).
found=1
for comm in /proc/[0-9]*/comm; do
	if grep -qE -- "$1" "$comm" 2>/dev/null; then
		pid=${comm#/proc/}
		echo "${pid%/comm}"
		found=0
	fi
done
exit $found
`
	// ipcs prints the segments of the caller's IPC namespace. Its header has no digits: critest
	// looks for a segment ID anywhere in the output.
	ipcs = `#!/bin/sh
# ipcs [-m]: the System V shared memory segments of this IPC namespace (Debian's busybox has none).
echo "------ Shared Memory Segments --------"
echo "key        shmid      owner      perms      bytes      nattch"
awk 'NR > 1 { printf "%-10s %-10s %-10s %-10s %-10s %-10s\n", $1, $2, $8, $3, $4, $7 }' /proc/sysvipc/shm
`
	// httpdForeground stands in for the httpd image's httpd-foreground: critest reads "httpd"
	// in the container's log and fetches / on port 80.
	httpdForeground = `#!/bin/sh
# busybox httpd in the foreground on :80; exits 0 on SIGTERM (it runs as PID 1).
echo "httpd: serving /usr/local/apache2/htdocs on :80"
httpd -f -p 80 -h /usr/local/apache2/htdocs &
pid=$!
trap 'kill "$pid"; exit 0' TERM INT
wait "$pid"
`
)

// Images returns every image critest pulls, but DigestPinnedImage, with all its references.
func Images(in Inputs) ([]ociimage.Image, error) {
	base, err := BusyboxLayer(in.Busybox)
	if err != nil {
		return nil, err
	}
	read := func(binary string) ([]byte, error) {
		data, err := os.ReadFile(binary)
		if err != nil {
			return nil, fmt.Errorf("critest images: %w", err)
		}
		return data, nil
	}
	pause, err := read(in.Pause)
	if err != nil {
		return nil, err
	}
	fakeNginx, err := read(in.FakeNginx)
	if err != nil {
		return nil, err
	}
	nnp, err := read(in.NoNewPrivs)
	if err != nil {
		return nil, err
	}

	shell := v1.Config{Env: []string{ociimage.DefaultPath}, Cmd: []string{"sh"}}
	with := func(change func(*v1.Config)) v1.Config {
		config := shell
		config.Env = slices.Clone(shell.Env)
		change(&config)
		return config
	}
	onBase := func(extra ...ociimage.File) []ociimage.Layer {
		if len(extra) == 0 {
			return []ociimage.Layer{base}
		}
		return []ociimage.Layer{base, extra}
	}
	nginxLayer := []ociimage.File{
		ociimage.Dir("usr/sbin", 0o755),
		ociimage.RegularFile("usr/sbin/nginx", 0o755, fakeNginx),
	}
	nginx := func(port string) v1.Config {
		return with(func(c *v1.Config) {
			c.Cmd = []string{"nginx", "-g", "daemon off;"}
			c.Env = append(c.Env, "NGINX_LISTEN=:"+port)
			c.ExposedPorts = map[string]struct{}{port + "/tcp": {}}
		})
	}
	// The pause images differ by label, so that 3.9 and the sandbox image 3.10 have different
	// IDs, as upstream's do.
	pauseImage := func(version string, names ...string) ociimage.Image {
		return ociimage.Image{
			Names:  names,
			Layers: []ociimage.Layer{{ociimage.RegularFile("pause", 0o755, pause)}},
			Config: v1.Config{Env: []string{ociimage.DefaultPath}, Entrypoint: []string{"/pause"},
				User: "65535:65535", Labels: map[string]string{"version": version}},
		}
	}
	user := func(name, user string) ociimage.Image {
		return ociimage.Image{Names: []string{criToolsImage + name + ":latest"},
			Layers: onBase(), Config: with(func(c *v1.Config) { c.User = user })}
	}
	// An empty file names the image, as in cri-tools' images/image-test.
	marked := func(marker string, names ...string) ociimage.Image {
		return ociimage.Image{Names: names, Config: shell,
			Layers: onBase(ociimage.RegularFile(marker, 0o644, nil))}
	}

	images := []ociimage.Image{
		{Names: []string{e2eImages + "busybox:1.29-2"}, Layers: onBase(), Config: shell},
		{Names: []string{e2eImages + "nginx:1.14-2"}, Layers: onBase(nginxLayer...), Config: nginx("80")},
		// As cri-tools' images/hostnet-nginx: nginx on port 12003, for host-network pods.
		{Names: []string{criToolsImage + "hostnet-nginx-" + runtime.GOARCH + ":latest"}, Layers: onBase(nginxLayer...),
			Config: nginx("12003")},
		{Names: []string{e2eImages + "httpd:2.4.39-4"}, Config: with(func(c *v1.Config) {
			c.Cmd = []string{"httpd-foreground"}
			c.ExposedPorts = map[string]struct{}{"80/tcp": {}}
		}), Layers: onBase(ociimage.Layer{
			ociimage.RegularFile("usr/local/bin/httpd-foreground", 0o755, []byte(httpdForeground)),
			ociimage.RegularFile("usr/local/apache2/htdocs/index.html", 0o644,
				[]byte("<html><body><h1>It works!</h1></body></html>\n")),
		}.WithParents()...)},
		{Names: []string{e2eImages + "nonewprivs:1.3"}, Config: with(func(c *v1.Config) {
			c.Cmd = nil
			c.Entrypoint = []string{"/usr/local/bin/nnp"}
		}), Layers: onBase(ociimage.Layer{ociimage.RegularFile("usr/local/bin/nnp", 0o4755, nnp)}.WithParents()...)},
		pauseImage("3.10", SandboxImage),
		pauseImage("3.9", "registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9"),
		user("test-image-user-uid", "1002"),
		user("test-image-user-username", "www-data"),
		user("test-image-user-uid-group", "1003:1004"),
		user("test-image-user-username-group", "www-data:1004"),
		{Names: []string{criToolsImage + "test-image-predefined-group:latest"},
			Config: with(func(c *v1.Config) { c.User = "1000" }),
			// As `adduser -u 1000 -D default-user && addgroup -g 50000 group-defined-in-image &&
			// addgroup default-user group-defined-in-image` would leave them.
			Layers: onBase(ociimage.Dir("etc", 0o755), ociimage.Dir("home", 0o755),
				ociimage.Dir("home/default-user", 0o755).Owner(1000, 1000),
				etcFile("etc/passwd", passwd+"default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n"),
				etcFile("etc/group", group+"default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n"),
				etcFile("etc/shadow", shadow(passwd)+"default-user:!:0:0:99999:7:::\n"))},
		marked("test-image-1", criToolsImage+"test-image-1:latest"),
		marked("test-image-2", criToolsImage+"test-image-2:latest"),
		marked("test-image-3", criToolsImage+"test-image-3:latest"),
		marked("test-image-latest", criToolsImage+"test-image-latest:latest"),
		marked("same-image", criToolsImage+"test-image-tags:1", criToolsImage+"test-image-tags:2", criToolsImage+"test-image-tags:3"),
		marked("test", criToolsImage+"test-image-tag:test"),
		marked("all", criToolsImage+"test-image-tag:all"),
	}
	return images, nil
}

func etcFile(name, content string) ociimage.File {
	mode := int64(0o644)
	if name == "etc/shadow" {
		mode = 0o640
	}
	return ociimage.RegularFile(name, mode, []byte(content))
}

// shadow returns a shadow file locking the password of every user of passwd.
func shadow(passwd string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(strings.TrimSpace(passwd), "\n") {
		name, _, _ := strings.Cut(line, ":")
		b.WriteString(name + ":*:0:0:99999:7:::\n")
	}
	return b.String()
}

// BusyboxLayer returns the root file system of the busybox image (docker.io/library/busybox) as
// the CRI test suites expect it, made of busybox, a dynamically linked busybox: the base of
// critest's images and of those of containerd's CRI integration tests.
func BusyboxLayer(busybox string) (ociimage.Layer, error) {
	binary, err := os.ReadFile(busybox)
	if err != nil {
		return nil, fmt.Errorf("critest images: %w", err)
	}
	libs, err := sharedLibraries(busybox)
	if err != nil {
		return nil, fmt.Errorf("critest images: %s: %w", busybox, err)
	}
	applets, err := ociimage.BusyboxApplets(busybox)
	if err != nil {
		return nil, fmt.Errorf("critest images: %w", err)
	}

	files := ociimage.Layer{
		ociimage.Dir("dev", 0o755), ociimage.Dir("home", 0o755), ociimage.Dir("proc", 0o755),
		ociimage.Dir("root", 0o700), ociimage.Dir("sys", 0o755), ociimage.Dir("tmp", 0o1777),
		ociimage.Dir("usr/sbin", 0o755), ociimage.Dir("var/run", 0o755),
		ociimage.Dir("var/spool/mail", 0o755), ociimage.Dir("var/www", 0o755),
		ociimage.RegularFile("bin/busybox", 0o755, binary),
		ociimage.RegularFile("bin/pgrep", 0o755, []byte(pgrep)),
		ociimage.RegularFile("bin/ipcs", 0o755, []byte(ipcs)),
		etcFile("etc/passwd", passwd),
		etcFile("etc/group", group),
		etcFile("etc/shadow", shadow(passwd)),
	}
	files = append(files, libs...)
	// As in the busybox image: every applet in /bin, whatever directory busybox suggests.
	linked := map[string]bool{"busybox": true, "pgrep": true, "ipcs": true}
	for _, applet := range applets {
		name := path.Base(applet)
		if linked[name] {
			continue
		}
		linked[name] = true
		files = append(files, ociimage.Hardlink("bin/"+name, "bin/busybox"))
	}
	return files.WithParents(), nil
}

// sharedLibraries returns the dynamic loader (at the path binary names, plus the file it links
// to) and the libraries binary needs, taken from the loader's directory of this machine.
func sharedLibraries(binary string) ([]ociimage.File, error) {
	f, err := elf.Open(binary)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var interp string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			data := make([]byte, p.Filesz)
			if _, err := p.ReadAt(data, 0); err != nil {
				return nil, fmt.Errorf("read the program interpreter: %w", err)
			}
			interp = strings.TrimRight(string(data), "\x00")
		}
	}
	if interp == "" {
		return nil, errors.New("not dynamically linked (want Debian's busybox, not busybox-static)")
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return nil, err
	}

	var files []ociimage.File
	loader := interp
	if target, err := os.Readlink(interp); err == nil {
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(interp), target)
		}
		loader = filepath.Clean(target)
		files = append(files, ociimage.Symlink(strings.TrimPrefix(interp, "/"), loader))
	}
	libDir := filepath.Dir(loader)
	for _, lib := range append([]string{filepath.Base(loader)}, needed...) {
		hostPath := filepath.Join(libDir, lib)
		data, err := os.ReadFile(hostPath) // follows the library's symlinks
		if err != nil {
			return nil, fmt.Errorf("shared library %s: %w", lib, err)
		}
		files = append(files, ociimage.RegularFile(strings.TrimPrefix(hostPath, "/"), 0o755, data))
	}
	return files, nil
}
