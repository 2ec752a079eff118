// Command knext-images writes knext's test image archives and nri-bridge's image archive (see package
// ociimage for names and contents) into a directory:
//
//	go run ./cmd/knext-images -pause-binary build/images/pause -busybox /bin/busybox \
//		-nri-bridge-binary build/bin/nri-bridge -nri-bridge-image knext.local/nri-bridge:<tag> -out build/images
//
// -pause-binary is internal/ociimage/pause built statically (CGO_ENABLED=0), and so is
// -nri-bridge-binary (`make build`). Each -image REPOSITORY:TAG=BINARY (repeatable) writes the
// archive <name>.tar of an image holding only that static binary, as /usr/local/bin/<name>, its
// entrypoint, where <name> is the repository's last element: the cluster's CoreDNS and netcheck.
// Only the archives whose inputs are given are written.
package main

import (
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/knext-dev/knext/internal/ociimage"
)

// binaryImages collects -image flags.
type binaryImages []string

func (b *binaryImages) String() string     { return strings.Join(*b, ",") }
func (b *binaryImages) Set(v string) error { *b = append(*b, v); return nil }

func main() {
	pauseBinary := flag.String("pause-binary", "", "static pause executable (built from ./internal/ociimage/pause)")
	busybox := flag.String("busybox", "", "statically linked busybox (Debian package busybox-static: /bin/busybox)")
	nriBridgeBinary := flag.String("nri-bridge-binary", "", "static nri-bridge executable")
	nriBridgeImage := flag.String("nri-bridge-image", "", "name of nri-bridge's image: "+ociimage.NRIBridgeRepository+":<knext version>")
	var images binaryImages
	flag.Var(&images, "image", "`REPOSITORY:TAG=BINARY`: an image of one static executable (repeatable)")
	out := flag.String("out", "", "directory to write the archives into")
	flag.Parse()
	if *out == "" || flag.NArg() != 0 || (*nriBridgeBinary == "") != (*nriBridgeImage == "") ||
		(*pauseBinary == "" && *busybox == "" && *nriBridgeBinary == "" && len(images) == 0) {
		flag.Usage()
		os.Exit(2)
	}
	if err := writeArchives(*out, *pauseBinary, *busybox, *nriBridgeBinary, *nriBridgeImage, images); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func writeArchives(dir, pauseBinary, busybox, nriBridgeBinary, nriBridgeImage string, binaries []string) error {
	images := map[string]func() (ociimage.Image, error){}
	if pauseBinary != "" {
		images[ociimage.PauseArchive] = func() (ociimage.Image, error) { return ociimage.Pause(pauseBinary) }
	}
	if busybox != "" {
		images[ociimage.BusyboxArchive] = func() (ociimage.Image, error) { return ociimage.Busybox(busybox) }
	}
	if nriBridgeBinary != "" {
		images[ociimage.NRIBridgeArchive] = func() (ociimage.Image, error) {
			return ociimage.NRIBridge(nriBridgeImage, nriBridgeBinary)
		}
	}
	for _, image := range binaries {
		name, binary, ok := strings.Cut(image, "=")
		repository, _, tagged := strings.Cut(name, ":")
		if !ok || !tagged || binary == "" {
			return fmt.Errorf("-image %q is not REPOSITORY:TAG=BINARY", image)
		}
		command := path.Base(repository)
		images[command+".tar"] = func() (ociimage.Image, error) { return ociimage.Binary(name, command, binary) }
	}
	for archive, declare := range images {
		image, err := declare()
		if err != nil {
			return err
		}
		if err := ociimage.WriteArchiveFile(filepath.Join(dir, archive), image); err != nil {
			return err
		}
	}
	return nil
}
