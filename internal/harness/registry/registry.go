// Package registry is knext's test registry: go-containerregistry's in-memory registry, loaded
// with the images of OCI image-layout archives (package testimages, `ctr images export`) under
// the names in their io.containerd.image.name annotations and under aliases, then served
// read-only over TLS with a certificate from a CA generated for the run.
//
// One server stands for several registry hosts. A request names its host in one of two ways:
//   - the Host header, when clients resolve the registry host names to the server (a private
//     /etc/hosts: contrib/ci/upstream/ociregistry);
//   - the `ns` query parameter, which containerd adds when it pulls through a hosts.toml that
//     names the server (`server = "https://127.0.0.1:PORT"` under certs.d/<registry host>/).
//
// The image host/repository:tag is stored as the repository host/repository of the in-memory
// registry, so that two hosts may serve the same repository name.
package registry

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/knext-dev/knext/internal/harness/testimages"
)

// storeHost is the registry host of references into the in-memory store; requests to it never
// leave the process.
const storeHost = "store.invalid"

// Registry is the in-memory registry and the image names it serves. Load archives and add
// aliases before serving.
type Registry struct {
	store http.Handler
	log   *log.Logger
	names []name.Tag
}

// New returns an empty registry that logs every request to logger.
func New(logger *log.Logger) *Registry {
	return &Registry{store: ggcrregistry.New(ggcrregistry.Logger(logger)), log: logger}
}

// LoadArchive serves every image of the OCI image-layout tar archive at path that has a name
// annotation. Blobs are checked against their digests.
func (r *Registry) LoadArchive(path string) error {
	dir, err := os.MkdirTemp("", "knext-registry-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := extract(path, dir); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	index, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return fmt.Errorf("%s: not an OCI image layout archive: %w", path, err)
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	named := 0
	for _, desc := range manifest.Manifests {
		imageName := desc.Annotations[testimages.ImageNameAnnotation]
		if imageName == "" {
			continue
		}
		var image remote.Taggable
		if desc.MediaType.IsIndex() {
			image, err = index.ImageIndex(desc.Digest)
		} else {
			image, err = index.Image(desc.Digest)
		}
		if err == nil {
			err = r.add(imageName, image)
		}
		if err != nil {
			return fmt.Errorf("%s: image %s: %w", path, imageName, err)
		}
		named++
	}
	if named == 0 {
		return fmt.Errorf("%s: no manifest in index.json has a %s annotation", path, testimages.ImageNameAnnotation)
	}
	return nil
}

// AddAlias also serves the image existing (host/repository:tag) under the name alias.
func (r *Registry) AddAlias(alias, existing string) error {
	i := slices.IndexFunc(r.names, func(tag name.Tag) bool { return tag.Name() == existing })
	if i < 0 {
		return fmt.Errorf("alias %s: no image %s in the archives (have %s)", alias, existing, strings.Join(r.Names(), ", "))
	}
	stored, err := storeTag(r.names[i])
	var image *remote.Descriptor
	if err == nil {
		image, err = remote.Get(stored, r.storeOptions()...)
	}
	if err == nil {
		err = r.add(alias, image)
	}
	if err != nil {
		return fmt.Errorf("alias %s: %w", alias, err)
	}
	return nil
}

// add pushes image into the store under imageName.
func (r *Registry) add(imageName string, image remote.Taggable) error {
	tag, err := name.NewTag(imageName, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("image name %q is not host/repository:tag: %w", imageName, err)
	}
	if slices.Contains(r.Names(), tag.Name()) {
		return fmt.Errorf("image %s is defined twice", tag)
	}
	stored, err := storeTag(tag)
	if err != nil {
		return err
	}
	if err := remote.Push(stored, image, r.storeOptions()...); err != nil {
		return err
	}
	r.names = append(r.names, tag)
	return nil
}

// storeTag is where the store keeps the image tag.
func storeTag(tag name.Tag) (name.Tag, error) {
	repository, err := name.NewRepository(storeHost + "/" + tag.RegistryStr() + "/" + tag.RepositoryStr())
	return repository.Tag(tag.TagStr()), err
}

func (r *Registry) storeOptions() []remote.Option {
	return []remote.Option{remote.WithTransport(handlerTransport{r.store})}
}

// handlerTransport answers requests with an http.Handler, in the process.
type handlerTransport struct{ handler http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	served := req
	if req.Body == nil { // as a server's request always has one
		served = req.Clone(req.Context())
		served.Body = http.NoBody
	}
	recorder := httptest.NewRecorder()
	t.handler.ServeHTTP(recorder, served)
	resp := recorder.Result()
	resp.Request = req // relative Location headers resolve against it
	return resp, nil
}

// Names returns the served image names, sorted.
func (r *Registry) Names() []string {
	var names []string
	for _, tag := range r.names {
		names = append(names, tag.Name())
	}
	slices.Sort(names)
	return names
}

// Hosts returns the registry hosts of the served images, sorted: the names the certificate
// covers, or the hosts that need a hosts.toml.
func (r *Registry) Hosts() []string {
	var hosts []string
	for _, tag := range r.names {
		hosts = append(hosts, tag.RegistryStr())
	}
	slices.Sort(hosts)
	return slices.Compact(hosts)
}

// ServeHTTP serves the pull side of the distribution API (GET and HEAD of /v2/, manifests by
// tag or digest, blobs) for the registry host the request names.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		r.log.Printf("%s %s: refused, the registry is read-only", req.Method, req.URL)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMethodNotAllowed)
		io.WriteString(w, `{"errors":[{"code":"UNSUPPORTED","message":"this registry is read-only"}]}`)
		return
	}
	if repository, ok := strings.CutPrefix(req.URL.Path, "/v2/"); ok && repository != "" {
		req = req.Clone(req.Context())
		req.URL.Path = "/v2/" + requestHost(req) + "/" + repository
		req.URL.RawPath = ""
	}
	r.store.ServeHTTP(w, req)
}

// requestHost returns the registry host a request is for: containerd's mirror parameter ns when
// present, else the Host header without its port.
func requestHost(req *http.Request) string {
	if ns := req.URL.Query().Get("ns"); ns != "" {
		return ns
	}
	if host, _, err := net.SplitHostPort(req.Host); err == nil {
		return host
	}
	return req.Host
}

// Server serves a Registry over TLS.
type Server struct {
	// Addr is the address the server listens on, host:port.
	Addr string
	// CACert is the PEM certificate of the CA that signed the server's certificate: what clients
	// trust.
	CACert []byte

	server *http.Server
	served chan error
}

// ServeTLS serves r on listen (host:port; port 0 picks a free one) until Close, with a
// certificate for r's hosts and for the listening IP. Load archives and add aliases first.
func (r *Registry) ServeTLS(listen string) (*Server, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	var ips []net.IP
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsUnspecified() {
		ips = append(ips, ip)
	}
	tlsConfig, caCert, err := newCertificate(r.Hosts(), ips)
	if err != nil {
		ln.Close()
		return nil, err
	}
	s := &Server{
		Addr:   ln.Addr().String(),
		CACert: caCert,
		server: &http.Server{Handler: r, TLSConfig: tlsConfig, ErrorLog: r.log, ReadHeaderTimeout: 10 * time.Second},
		served: make(chan error, 1),
	}
	go func() { s.served <- s.server.ServeTLS(ln, "", "") }()
	return s, nil
}

// Close stops the server, and returns why it stopped serving if not because of Close.
func (s *Server) Close() error {
	closeErr := s.server.Close()
	if err := <-s.served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return closeErr
}

// extract writes the regular files of the tar archive at path under dir.
func extract(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		header, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		file := path.Clean(header.Name)
		if header.Typeflag != tar.TypeReg {
			continue
		}
		if !filepath.IsLocal(file) {
			return fmt.Errorf("%s points outside the archive", header.Name)
		}
		if err := writeFile(filepath.Join(dir, file), tr); err != nil {
			return err
		}
	}
}

func writeFile(name string, content io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, content); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
