package stack

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/knext-dev/knext/internal/ociimage"
)

const modulePath = "github.com/knext-dev/knext"

// complete fills in defaults and checks that every file the harness needs is there, saying how
// to get what is missing.
func (o *Options) complete() error {
	if os.Geteuid() != 0 {
		return errors.New("the harness needs root (mounts, network namespaces, cgroups)")
	}
	if o.BinDir == "" {
		o.BinDir = os.Getenv("KNEXT_BIN_DIR")
	}
	if o.ImageDir == "" {
		o.ImageDir = os.Getenv("KNEXT_IMAGES_DIR")
	}
	if o.BinDir == "" || o.ImageDir == "" {
		repo, err := repositoryRoot()
		if err != nil {
			return err
		}
		if o.BinDir == "" {
			o.BinDir = filepath.Join(repo, "build", "bin")
		}
		if o.ImageDir == "" {
			o.ImageDir = filepath.Join(repo, "build", "images")
		}
	}
	if o.Containerd == "" {
		o.Containerd = filepath.Join(o.BinDir, "containerd")
	}
	if o.Runc == "" {
		o.Runc = "/usr/local/bin/runc"
	}
	if o.Crictl == "" {
		o.Crictl = "crictl"
	}
	if crictl, err := exec.LookPath(o.Crictl); err == nil {
		o.Crictl = crictl
	}
	if o.CNIBinDir == "" {
		o.CNIBinDir = "/usr/lib/cni"
	}
	if o.NRIRequestTimeout == 0 {
		o.NRIRequestTimeout = 2 * time.Second
	}
	if o.NRIRegistrationTimeout == 0 {
		o.NRIRegistrationTimeout = 5 * time.Second
	}
	if o.LogLevel == "" {
		o.LogLevel = "info"
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 60 * time.Second
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}

	const build, images, deps = "run `make build`", "run `make images`", "run script/ci/install-deps.sh"
	required := []struct{ path, remedy string }{
		{o.Containerd, build},
		{filepath.Join(filepath.Dir(o.Containerd), "containerd-shim-runc-v2"), build},
		{filepath.Join(o.BinDir, "ctr"), build},
		{filepath.Join(o.ImageDir, ociimage.PauseArchive), images},
		{filepath.Join(o.ImageDir, ociimage.BusyboxArchive), images},
		{o.Runc, deps},
		{o.Crictl, deps},
		{filepath.Join(o.CNIBinDir, "bridge"), deps},
		{filepath.Join(o.CNIBinDir, "host-local"), deps},
		{filepath.Join(o.CNIBinDir, "loopback"), deps},
	}
	if o.CNIPortMappings {
		required = append(required, struct{ path, remedy string }{filepath.Join(o.CNIBinDir, "portmap"), deps})
	}
	var errs []error
	for _, r := range required {
		if _, err := os.Stat(r.path); err != nil {
			errs = append(errs, fmt.Errorf("missing %s: %s", r.path, r.remedy))
		}
	}
	return errors.Join(errs...)
}

// repositoryRoot finds the knext checkout around the working directory.
func repositoryRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if isKnextModule(filepath.Join(dir, "go.mod")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no %s checkout around the working directory: set KNEXT_BIN_DIR and KNEXT_IMAGES_DIR", modulePath)
		}
		dir = parent
	}
}

func isKnextModule(goMod string) bool {
	f, err := os.Open(goMod)
	if err != nil {
		return false
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	return scanner.Scan() && scanner.Text() == "module "+modulePath
}
