// Package registry is a read-only OCI distribution registry serving the images of OCI
// image-layout archives (as package testimages and `ctr images export` write them) under the
// names in their io.containerd.image.name annotations.
//
// A request names its registry host in one of two ways:
//   - the Host header, when clients resolve the registry's host name to this server (a private
//     /etc/hosts, with TLS: see contrib/ci/upstream/ociregistry);
//   - the `ns` query parameter, which containerd adds when it pulls through a mirror configured in
//     a hosts.toml (`server = "http://127.0.0.1:PORT"` under certs.d/<registry host>/): the path
//     then holds only the repository, and ns the registry host of the image reference.
package registry

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
)

// imageNameAnnotation is where `ctr images export` and our image builder record an image's name.
const imageNameAnnotation = "io.containerd.image.name"

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Registry holds every blob of the loaded archives (content addressed, so one map serves all
// repositories) and the manifest each image name (host/repository:tag) points to. Load archives
// and add aliases before serving: the maps are not locked.
type Registry struct {
	// Logf receives one line per request. Default: log.Printf.
	Logf func(format string, args ...any)

	blobs     map[string][]byte
	manifests map[string]descriptor
}

// New returns an empty registry.
func New() *Registry {
	return &Registry{Logf: log.Printf, blobs: map[string][]byte{}, manifests: map[string]descriptor{}}
}

// LoadArchive reads an OCI image-layout tar archive, checking every blob against its digest, and
// serves every image of its index that has a name annotation.
func (r *Registry) LoadArchive(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	foundIndex := false
	blobs := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		name := strings.TrimPrefix(hdr.Name, "./")
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", path, name, err)
		}
		switch {
		case name == "index.json":
			if err := json.Unmarshal(data, &index); err != nil {
				return fmt.Errorf("%s: index.json: %w", path, err)
			}
			foundIndex = true
		case strings.HasPrefix(name, "blobs/sha256/"):
			want := strings.TrimPrefix(name, "blobs/sha256/")
			sum := sha256.Sum256(data)
			if got := hex.EncodeToString(sum[:]); got != want {
				return fmt.Errorf("%s: blob %s has digest sha256:%s", path, name, got)
			}
			blobs["sha256:"+want] = data
		}
	}
	if !foundIndex {
		return fmt.Errorf("%s: no index.json: not an OCI image layout archive", path)
	}
	named := 0
	for _, desc := range index.Manifests {
		name := desc.Annotations[imageNameAnnotation]
		if name == "" {
			continue
		}
		if _, ok := blobs[desc.Digest]; !ok {
			return fmt.Errorf("%s: image %s: manifest %s is not in the archive", path, name, desc.Digest)
		}
		if err := r.addManifest(name, desc); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		named++
	}
	if named == 0 {
		return fmt.Errorf("%s: no manifest in index.json has a %s annotation", path, imageNameAnnotation)
	}
	maps.Copy(r.blobs, blobs)
	return nil
}

func (r *Registry) addManifest(name string, desc descriptor) error {
	if _, _, _, err := splitImageName(name); err != nil {
		return err
	}
	if _, exists := r.manifests[name]; exists {
		return fmt.Errorf("image %s is defined twice", name)
	}
	r.manifests[name] = desc
	return nil
}

// AddAlias also serves image existing under the name `name` (host/repository:tag).
func (r *Registry) AddAlias(name, existing string) error {
	desc, ok := r.manifests[existing]
	if !ok {
		return fmt.Errorf("alias %s: no image %s in the archives (have %s)", name, existing,
			strings.Join(r.Names(), ", "))
	}
	return r.addManifest(name, desc)
}

// Names returns the served image names, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.manifests))
	for name := range r.manifests {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Hosts returns the registry host names of all served images, sorted: the names a TLS
// certificate must cover, or the hosts that need a mirror configuration.
func (r *Registry) Hosts() []string {
	var hosts []string
	for name := range r.manifests {
		host, _, _, _ := splitImageName(name)
		if !slices.Contains(hosts, host) {
			hosts = append(hosts, host)
		}
	}
	slices.Sort(hosts)
	return hosts
}

// splitImageName splits a fully qualified host/repository:tag name.
func splitImageName(name string) (host, repo, tag string, err error) {
	host, rest, ok := strings.Cut(name, "/")
	if ok {
		repo, tag, ok = strings.Cut(rest, ":")
	}
	if !ok || host == "" || repo == "" || tag == "" || !strings.Contains(host, ".") {
		return "", "", "", fmt.Errorf("image name %q is not host/repository:tag with a dotted host", name)
	}
	return host, repo, tag, nil
}

// ServeHTTP implements the read-only part of the OCI distribution API that pulls use:
// /v2/, manifests by tag or digest, and blobs by digest (GET and HEAD).
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		writeError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "this registry is read-only")
		return
	}
	if req.URL.Path == "/v2/" || req.URL.Path == "/v2" {
		w.WriteHeader(http.StatusOK)
		return
	}
	host := requestHost(req)
	data, mediaType, err := r.lookup(host, strings.TrimPrefix(req.URL.Path, "/v2/"))
	if err != nil {
		r.Logf("ociregistry: %s %s%s: %v", req.Method, host, req.URL.Path, err)
		if nf, ok := errors.AsType[notFoundError](err); ok {
			writeError(w, http.StatusNotFound, nf.code, err.Error())
		} else {
			writeError(w, http.StatusBadRequest, "NAME_INVALID", err.Error())
		}
		return
	}
	r.Logf("ociregistry: %s %s%s", req.Method, host, req.URL.Path)
	sum := sha256.Sum256(data)
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.Header().Set("Docker-Content-Digest", "sha256:"+hex.EncodeToString(sum[:]))
	if req.Method == http.MethodGet {
		w.Write(data)
	}
}

// requestHost returns the registry host a request is for: containerd's mirror parameter ns when
// present, else the Host header without its port.
func requestHost(req *http.Request) string {
	if ns := req.URL.Query().Get("ns"); ns != "" {
		return ns
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return host
}

type notFoundError struct{ code, what string }

func (e notFoundError) Error() string { return e.what + " not found" }

// lookup resolves "<repository>/manifests/<tag or digest>" or "<repository>/blobs/<digest>".
func (r *Registry) lookup(host, path string) (data []byte, mediaType string, err error) {
	if repo, ref, ok := cutLast(path, "/manifests/"); ok {
		if strings.HasPrefix(ref, "sha256:") {
			data, ok := r.blobs[ref]
			if !ok {
				return nil, "", notFoundError{"MANIFEST_UNKNOWN", "manifest " + ref}
			}
			var m struct {
				MediaType string `json:"mediaType"`
			}
			if err := json.Unmarshal(data, &m); err != nil || m.MediaType == "" {
				return nil, "", notFoundError{"MANIFEST_UNKNOWN", "manifest " + ref + " (blob is no manifest)"}
			}
			return data, m.MediaType, nil
		}
		name := host + "/" + repo + ":" + ref
		desc, ok := r.manifests[name]
		if !ok {
			return nil, "", notFoundError{"MANIFEST_UNKNOWN", "image " + name}
		}
		return r.blobs[desc.Digest], desc.MediaType, nil
	}
	if _, digest, ok := cutLast(path, "/blobs/"); ok {
		data, ok := r.blobs[digest]
		if !ok {
			return nil, "", notFoundError{"BLOB_UNKNOWN", "blob " + digest}
		}
		return data, "application/octet-stream", nil
	}
	return nil, "", fmt.Errorf("unsupported path /v2/%s", path)
}

func cutLast(s, sep string) (before, after string, found bool) {
	i := strings.LastIndex(s, sep)
	if i <= 0 || i+len(sep) == len(s) {
		return "", "", false
	}
	return s[:i], s[i+len(sep):], true
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{
		"errors": []map[string]string{{"code": code, "message": message}},
	})
}
