// Command images writes knext's test image archives (see package testimages for names and
// contents) into a directory:
//
//	go run ./contrib/images -pause-binary build/images/pause -busybox /bin/busybox -out build/images
//
// -pause-binary is contrib/images/pause built statically (CGO_ENABLED=0).
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
	out := flag.String("out", "", "directory to write "+testimages.PauseArchive+" and "+testimages.BusyboxArchive+" into")
	flag.Parse()
	if *pauseBinary == "" || *out == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := writeArchives(*out, *pauseBinary, *busybox); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func writeArchives(dir, pauseBinary, busybox string) error {
	if err := testimages.WriteFile(filepath.Join(dir, testimages.PauseArchive), func(w io.Writer) error {
		return testimages.WritePause(w, pauseBinary)
	}); err != nil {
		return err
	}
	return testimages.WriteFile(filepath.Join(dir, testimages.BusyboxArchive), func(w io.Writer) error {
		return testimages.WriteBusybox(w, busybox)
	})
}
