// Package conformance is knext-conformance (cmd/knext-conformance): it runs the CRI validation suite (critest) against upstream containerd
// and knext, side by side (`make conformance`, docs/conformance.md):
//
//	knext-conformance images -busybox B -pause P -fakenginx F -nnp N -out critest-images.tar
//	knext-conformance run -critest C -images critest-images.tar -bin-dir B -upstream-bin-dir U \
//	    -out DIR
//	knext-conformance report -out DIR
//
// images writes every image critest pulls (package critestimages) into one archive. run runs
// critest once per configuration (upstream containerd with CNI, knext with CNI, knext CNI-less
// with nri-bridge), each in a network and IPC namespace of its own with a registry serving the
// archive, then prints the pass/fail/skip counts side by side and every spec whose outcome
// differs. It exits non-zero when a configuration failed a spec or could not run, or when the
// outcomes differ. report prints that comparison again from the reports a run left in DIR.
package conformance

import (
	"flag"
	"fmt"
	"os"

	"github.com/knext-dev/knext/internal/conformance/critestimages"
	"github.com/knext-dev/knext/internal/ociimage"
)

// Main runs knext-conformance with the command line of the process.
func Main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "images":
		err = imagesCommand(os.Args[2:])
	case "run":
		err = runCommand(os.Args[2:])
	case "report":
		err = reportCommand(os.Args[2:])
	case nodeCommandName:
		err = nodeCommand(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "knext-conformance:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: knext-conformance images|run|report [flags] (-h for the flags)")
	os.Exit(2)
}

func imagesCommand(args []string) error {
	fs := flag.NewFlagSet("images", flag.ExitOnError)
	var in critestimages.Inputs
	fs.StringVar(&in.Busybox, "busybox", "/usr/local/lib/knext/busybox", "dynamically linked busybox (Debian package busybox; script/ci/install-deps.sh)")
	fs.StringVar(&in.Pause, "pause", "", "static pause binary (internal/ociimage/pause)")
	fs.StringVar(&in.FakeNginx, "fakenginx", "", "static fakenginx binary (internal/conformance/fakenginx)")
	fs.StringVar(&in.NoNewPrivs, "nnp", "", "static nnp binary (internal/conformance/nnp)")
	out := fs.String("out", "", "archive to write")
	fs.Parse(args)
	if in.Pause == "" || in.FakeNginx == "" || in.NoNewPrivs == "" || *out == "" || fs.NArg() != 0 {
		fs.Usage()
		os.Exit(2)
	}
	images, err := critestimages.Images(in)
	if err != nil {
		return err
	}
	return ociimage.WriteArchiveFile(*out, images...)
}
