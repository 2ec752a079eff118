// Package githubreleases serves, as github.com would, the containerd release tarballs that
// upstream's release-upgrade tests download, and the tags of containerd's git repository that they
// list first (`git ls-remote --tags https://github.com/containerd/containerd.git 'refs/tags/v1.7.*'`),
// from a directory of tarballs built locally (previous-releases.sh): the tags are those of the
// tarballs there, nothing else.
package githubreleases

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// tarballName is the name of a release tarball: containerd-<version without v>-linux-<arch>.tar.gz.
var tarballName = regexp.MustCompile(`^containerd-([0-9]+\.[0-9]+\.[0-9]+[^/]*)-linux-[a-z0-9]+\.tar\.gz$`)

// Handler serves the tarballs of dir under /containerd/containerd/releases/download/<tag>/ and
// git's info/refs of /containerd/containerd.git with a tag per tarball. It reads dir once.
func Handler(dir string) (http.Handler, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var tags []string
	for _, e := range entries {
		if m := tarballName.FindStringSubmatch(e.Name()); m != nil {
			tags = append(tags, "v"+m[1])
		}
	}
	if len(tags) == 0 {
		return nil, fmt.Errorf("no containerd release tarball (containerd-<version>-linux-<arch>.tar.gz) in %s", dir)
	}
	slices.Sort(tags)
	tags = slices.Compact(tags)

	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerd/containerd/releases/download/{tag}/{file}", func(w http.ResponseWriter, r *http.Request) {
		tag, file := r.PathValue("tag"), r.PathValue("file")
		if m := tarballName.FindStringSubmatch(file); m == nil || "v"+m[1] != tag {
			http.NotFound(w, r)
			return
		}
		http.ServeFile(w, r, filepath.Join(dir, file))
	})
	// The dumb HTTP protocol's ref list, which git falls back to when the answer is not the smart
	// protocol's content type: one "<object id>\t<ref>" line per ref. No object is ever fetched, so
	// a tag's object id only has to be a well-formed one: its index, in 40 hex digits.
	mux.HandleFunc("GET /containerd/containerd.git/info/refs", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		var refs strings.Builder
		for i, tag := range tags {
			fmt.Fprintf(&refs, "%040x\trefs/tags/%s\n", i+1, tag)
		}
		fmt.Fprint(w, refs.String())
	})
	return mux, nil
}
