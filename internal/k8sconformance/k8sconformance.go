// Package k8sconformance is knext-k8s-conformance (cmd/knext-k8s-conformance): it runs Kubernetes' own end-to-end suite (e2e.test, built by
// third_party/kubernetes/build.sh at the pinned version) on a cluster of knext nodes (CNI-less,
// nri-bridge) and on a cluster of upstream containerd with CNI, one after the other, and
// compares them spec by spec (`make k8s-conformance`, docs/conformance.md):
//
//	knext-k8s-conformance images -e2e-test E -rootfs R -agnhost A -agnhost-source D -coredns C \
//	    -pause P -busybox B -out e2e-images.tar
//	knext-k8s-conformance run -e2e-test E -images e2e-images.tar -out DIR [-nodes 2] \
//	    [-focus REGEXP] [-reruns 3] [-doc docs/conformance.md]
//	knext-k8s-conformance report -out DIR [-doc docs/conformance.md]
//
// images rebuilds the images the suite's sig-network specs run under the names e2e.test lists
// (package e2eimages) into one archive. run brings up a cluster of each runtime (package
// cluster: the nodes import the archive), runs the specs matching -focus on it, keeps the logs
// and removes the cluster; the specs whose outcome differs between the two are run again,
// -reruns times on each, before they are judged. It prints one table (spec, knext,
// upstream, verdict, duration), writes it into -doc's region <!-- k8s-conformance:results -->
// and exits non-zero when a spec regresses on knext (package compare: knext does worse than
// upstream in every run, e.g. it fails or skips a spec that passes upstream every time); a flaky
// spec is shown with its passes per column and does not fail. report does the comparison again
// from DIR.
package k8sconformance

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/knext-dev/knext/internal/compare"
	"github.com/knext-dev/knext/internal/docregion"
	"github.com/knext-dev/knext/internal/k8sconformance/e2eimages"
	"github.com/knext-dev/knext/internal/ociimage"
)

// DefaultFocus selects the sig-network specs of the Conformance profile.
const DefaultFocus = `\[sig-network\].*\[Conformance\]`

// Main runs knext-k8s-conformance with the command line of the process.
func Main() {
	if len(os.Args) < 2 {
		usage()
	}
	logger := log.New(os.Stderr, "", log.Ltime)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch command, args := os.Args[1], os.Args[2:]; command {
	case "images":
		err = imagesCommand(ctx, args, logger.Printf)
	case "run":
		err = runCommand(ctx, args, logger.Printf)
	case "report":
		err = reportCommand(args)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "knext-k8s-conformance:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: knext-k8s-conformance images|run|report [flags] (-h for each one's flags)")
	os.Exit(2)
}

func imagesCommand(ctx context.Context, args []string, logf func(string, ...any)) error {
	fs := flag.NewFlagSet("images", flag.ExitOnError)
	e2eTest := fs.String("e2e-test", "", "the suite's binary, which lists the images (--list-images)")
	var in e2eimages.Inputs
	fs.StringVar(&in.RootFS, "rootfs", "", "tar archive of the Debian root file system (mmdebstrap)")
	fs.StringVar(&in.Agnhost, "agnhost", "", "static agnhost binary")
	fs.StringVar(&in.AgnhostSource, "agnhost-source", "", "agnhost's source directory (k8s.io/kubernetes/test/images/agnhost)")
	fs.StringVar(&in.CoreDNS, "coredns", "", "static coredns binary")
	fs.StringVar(&in.Pause, "pause", "", "static pause binary (internal/ociimage/pause)")
	fs.StringVar(&in.Busybox, "busybox", "/bin/busybox", "statically linked busybox")
	out := fs.String("out", "", "archive to write")
	_ = fs.Parse(args) // ExitOnError
	if *e2eTest == "" || *out == "" || in.RootFS == "" || in.Agnhost == "" || in.AgnhostSource == "" || in.CoreDNS == "" || in.Pause == "" || fs.NArg() != 0 {
		fs.Usage()
		os.Exit(2)
	}
	list, err := exec.CommandContext(ctx, *e2eTest, "--list-images").Output()
	if err != nil {
		return fmt.Errorf("%s --list-images: %w", *e2eTest, err)
	}
	images, left, err := e2eimages.Images(in, strings.Fields(string(list)))
	if err != nil {
		return err
	}
	if err := ociimage.WriteArchiveFile(*out, images...); err != nil {
		return err
	}
	var names []string
	for _, image := range images {
		names = append(names, image.Names...)
	}
	logf("wrote %s: %s", *out, strings.Join(names, " "))
	logf("not rebuilt (a spec that runs one of these fails to pull it): %s", strings.Join(left, " "))
	return nil
}

func runCommand(ctx context.Context, args []string, logf func(string, ...any)) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	r := &runner{logf: logf}
	fs.StringVar(&r.e2eTest, "e2e-test", "", "the suite's binary (third_party/kubernetes/build.sh DIR e2e.test)")
	fs.StringVar(&r.images, "images", "", "the archive of the images command")
	fs.IntVar(&r.nodes, "nodes", 2, "nodes per cluster")
	fs.DurationVar(&r.timeout, "timeout", time.Hour, "the longest one e2e.test run may take")
	fs.StringVar(&r.out, "out", "", "results directory (replaced)")
	focus := fs.String("focus", DefaultFocus, "the specs to run: a regular expression on their full text (--ginkgo.focus)")
	reruns := fs.Int("reruns", compare.DefaultReruns, "runs again, on each cluster, of the specs whose outcome differs")
	doc := fs.String("doc", "", "page whose region <!-- k8s-conformance:results --> gets the table (none: only printed)")
	_ = fs.Parse(args) // ExitOnError
	if r.e2eTest == "" || r.images == "" || r.out == "" || fs.NArg() != 0 {
		fs.Usage()
		os.Exit(2)
	}
	if _, err := regexp.Compile(*focus); err != nil {
		return fmt.Errorf("-focus: %w", err)
	}
	version, err := exec.CommandContext(ctx, r.e2eTest, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %w", r.e2eTest, err)
	}
	if err := os.RemoveAll(r.out); err != nil {
		return err
	}
	if err := os.MkdirAll(r.out, 0o755); err != nil {
		return err
	}
	rec := &record{Started: time.Now(), Nodes: r.nodes, Focus: *focus, E2EVersion: strings.TrimSpace(string(version))}
	// Each run brings up a fresh cluster of each runtime in turn.
	runAll := func(number int, focus string) error {
		for _, column := range columns {
			a := &attempt{Column: column, Number: number, Focus: focus, Dir: filepath.Join(column, fmt.Sprintf("run-%d", number))}
			rec.Attempts = append(rec.Attempts, a)
			err := r.run(ctx, a)
			rec.Finished = time.Now()
			if err := errors.Join(err, rec.write(r.out)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := runAll(1, *focus); err != nil {
		return err
	}
	// The specs whose first runs differ run again on both clusters before they are judged.
	results, err := rec.results(r.out)
	if err != nil {
		return err
	}
	if names := results.first().comparison().Differing(); len(names) > 0 {
		for number := 2; number <= 1+*reruns; number++ {
			logf("%d specs differ between knext and upstream: run %d of them on both", len(names), number)
			if err := runAll(number, compare.GinkgoFocus(names)); err != nil {
				return err
			}
		}
	}
	return report(r.out, *doc)
}

func reportCommand(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	out := fs.String("out", "", "results directory of a run")
	doc := fs.String("doc", "", "page whose region <!-- k8s-conformance:results --> gets the table (none: only printed)")
	_ = fs.Parse(args) // ExitOnError
	if *out == "" || fs.NArg() != 0 {
		fs.Usage()
		os.Exit(2)
	}
	return report(*out, *doc)
}

// report compares the runs recorded in out, prints the table, writes it into doc (unless empty)
// and into out/report.md, and fails when a spec regresses on knext.
func report(out, doc string) error {
	rec, err := readRecord(out)
	if err != nil {
		return err
	}
	results, err := rec.results(out)
	if err != nil {
		return err
	}
	md, verdictErr := rec.markdown(results)
	fmt.Print(md)
	if err := os.WriteFile(filepath.Join(out, "report.md"), []byte(md), 0o644); err != nil {
		return err
	}
	if doc != "" {
		if err := docregion.FillFile(doc, "k8s-conformance", map[string]string{"results": md}); err != nil {
			return err
		}
	}
	return verdictErr
}
