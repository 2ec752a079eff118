// Command images writes knext's test image archives and nri-bridge's image archive (see package
// testimages for names and contents) into a directory:
//
//	go run ./contrib/images -pause-binary build/images/pause -busybox /bin/busybox \
//		-nri-bridge-binary build/bin/nri-bridge -nri-bridge-image knext.local/nri-bridge:<tag> -out build/images
//
// -pause-binary is contrib/images/pause built statically (CGO_ENABLED=0), and so is
// -nri-bridge-binary (`make build`).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/knext-dev/knext/contrib/images/testimages"
)

func main() {
	pauseBinary := flag.String("pause-binary", "", "static pause executable (built from ./contrib/images/pause)")
	busybox := flag.String("busybox", "/bin/busybox", "statically linked busybox (Debian package busybox-static)")
	nriBridgeBinary := flag.String("nri-bridge-binary", "", "static nri-bridge executable")
	nriBridgeImage := flag.String("nri-bridge-image", "", "name of nri-bridge's image: "+testimages.NRIBridgeRepository+":<knext version>")
	out := flag.String("out", "", "directory to write "+testimages.PauseArchive+", "+testimages.BusyboxArchive+" and "+testimages.NRIBridgeArchive+" into")
	flag.Parse()
	if *pauseBinary == "" || *nriBridgeBinary == "" || *nriBridgeImage == "" || *out == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := writeArchives(*out, *pauseBinary, *busybox, *nriBridgeBinary, *nriBridgeImage); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func writeArchives(dir, pauseBinary, busybox, nriBridgeBinary, nriBridgeImage string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := testimages.WriteFile(filepath.Join(dir, testimages.PauseArchive), func(w io.Writer) error {
		return testimages.WritePause(w, pauseBinary)
	}); err != nil {
		return err
	}
	if err := testimages.WriteFile(filepath.Join(dir, testimages.BusyboxArchive), func(w io.Writer) error {
		return testimages.WriteBusybox(w, busybox)
	}); err != nil {
		return err
	}
	return testimages.WriteFile(filepath.Join(dir, testimages.NRIBridgeArchive), func(w io.Writer) error {
		return testimages.WriteNRIBridge(w, nriBridgeImage, nriBridgeBinary)
	})
}
