// Command ociregistry serves OCI image-layout archives as a read-only registry over HTTPS
// (package internal/registry).
//
// A few of containerd's upstream integration tests pull an image by name instead of expecting it
// in the image store: they pull through the containerd client, or start a containerd with a
// default config whose sandbox image is registry.k8s.io/pause. No registry is reachable from CI,
// so cri-integration.sh runs this server inside the test's private network namespace,
// points the registry host names at it through a private /etc/hosts, and lets the tests trust
// the throwaway CA written to -ca-file through SSL_CERT_FILE.
//
// Usage:
//
//	ociregistry -listen 127.0.0.1:443 -ca-file ca.pem \
//	    -alias registry.k8s.io/pause:3.10.2=knext.local/pause:3.10 \
//	    [-github-releases DIR] pause.tar busybox.tar
//
// Every image of an archive is served under the name in its io.containerd.image.name
// annotation. With -github-releases it also stands for github.com, serving the containerd release
// tarballs of DIR and their tags (package githubreleases) to upstream's release-upgrade tests. The
// CA file is written once the server listens: its presence means "ready".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/knext-dev/knext/internal/registry"
	"github.com/knext-dev/knext/test/upstream/githubreleases"
)

type aliasFlags []string

func (a *aliasFlags) String() string     { return strings.Join(*a, ",") }
func (a *aliasFlags) Set(v string) error { *a = append(*a, v); return nil }

func main() {
	listen := flag.String("listen", "127.0.0.1:443", "address to serve HTTPS on")
	caFile := flag.String("ca-file", "", "where to write the PEM certificate of the CA clients must trust (required)")
	var aliases aliasFlags
	flag.Var(&aliases, "alias", "NEW=EXISTING: also serve image EXISTING under the name NEW (repeatable)")
	releases := flag.String("github-releases", "", "directory of containerd release tarballs to serve as github.com")
	flag.Parse()
	if *caFile == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: ociregistry -ca-file FILE [-listen ADDR] [-alias NEW=EXISTING]... [-github-releases DIR] ARCHIVE...")
		os.Exit(2)
	}
	if err := run(*listen, *caFile, *releases, aliases, flag.Args()); err != nil {
		log.Fatalf("ociregistry: %v", err)
	}
}

func run(listen, caFile, releases string, aliasFlags, archives []string) error {
	aliases := map[string]string{}
	for _, alias := range aliasFlags {
		name, existing, ok := strings.Cut(alias, "=")
		if !ok {
			return fmt.Errorf("alias %q is not NEW=EXISTING", alias)
		}
		if _, twice := aliases[name]; twice {
			return fmt.Errorf("alias %s is given twice", name)
		}
		aliases[name] = existing
	}
	sites := map[string]http.Handler{}
	if releases != "" {
		handler, err := githubreleases.Handler(releases)
		if err != nil {
			return err
		}
		sites["github.com"] = handler
	}
	srv, err := registry.Serve(registry.Options{Listen: listen, Archives: archives, Aliases: aliases, Sites: sites, Log: log.Default()})
	if err != nil {
		return err
	}
	if err := os.WriteFile(caFile, srv.CACert, 0o644); err != nil {
		return errors.Join(err, srv.Close())
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	return srv.Close()
}
