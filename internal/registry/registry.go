// Package registry is knext's test registry: go-containerregistry's in-memory registry, loaded
// with the images of OCI image-layout archives (package ociimage, `ctr images export`) under
// the names in their io.containerd.image.name annotations and under aliases, then served
// read-only over TLS with a certificate from a CA generated for the run.
//
// One server stands for several registry hosts. A request names its host in one of two ways:
//   - the Host header, when clients resolve the registry host names to the server (a private
//     /etc/hosts: test/upstream/ociregistry);
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
	"maps"
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

	"github.com/knext-dev/knext/internal/ociimage"
)

// storeHost is the registry host of references into the in-memory store; requests to it never
// leave the process.
const storeHost = "store.invalid"

// Options say what Serve serves, where, and where it logs.
type Options struct {
	// Listen is the address to serve on, host:port; port 0 picks a free one.
	Listen string
	// Archives are OCI image-layout archives: each image with a name annotation is served.
	Archives []string
	// Aliases serve, under each key (host/repository:tag), the image of the archives its value
	// names.
	Aliases map[string]string
	// Sites are other hosts the server stands for, each served by its handler (a release
	// download site, say): the certificate covers them too.
	Sites map[string]http.Handler
	// Log receives a line per request.
	Log *log.Logger
}

// Serve loads the archives and aliases of opts into a new registry and serves it over TLS until
// Close.
func Serve(opts Options) (*Server, error) {
	r := newRegistry(opts.Log)
	for _, archive := range opts.Archives {
		if err := r.loadArchive(archive); err != nil {
			return nil, err
		}
	}
	for _, alias := range slices.Sorted(maps.Keys(opts.Aliases)) {
		if err := r.addAlias(alias, opts.Aliases[alias]); err != nil {
			return nil, err
		}
	}
	r.sites = opts.Sites
	srv, err := r.serveTLS(opts.Listen)
	if err != nil {
		return nil, err
	}
	opts.Log.Printf("serving %s on %s", strings.Join(r.names(), " "), srv.Addr)
	return srv, nil
}

// registry is the in-memory registry and the image names it serves. Load archives and add
// aliases before serving.
type registry struct {
	store http.Handler
	sites map[string]http.Handler
	log   *log.Logger
	tags  []name.Tag
}

// newRegistry returns an empty registry that logs every request to logger.
func newRegistry(logger *log.Logger) *registry {
	return &registry{store: ggcrregistry.New(ggcrregistry.Logger(logger)), log: logger}
}

// loadArchive serves every image of the OCI image-layout tar archive at path that has a name
// annotation. Blobs are checked against their digests.
func (r *registry) loadArchive(path string) error {
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
		imageName := desc.Annotations[ociimage.ImageNameAnnotation]
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
		return fmt.Errorf("%s: no manifest in index.json has a %s annotation", path, ociimage.ImageNameAnnotation)
	}
	return nil
}

// addAlias also serves the image existing (host/repository:tag) under the name alias.
func (r *registry) addAlias(alias, existing string) error {
	i := slices.IndexFunc(r.tags, func(tag name.Tag) bool { return tag.Name() == existing })
	if i < 0 {
		return fmt.Errorf("alias %s: no image %s in the archives (have %s)", alias, existing, strings.Join(r.names(), ", "))
	}
	stored, err := storeTag(r.tags[i])
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
func (r *registry) add(imageName string, image remote.Taggable) error {
	tag, err := name.NewTag(imageName, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("image name %q is not host/repository:tag: %w", imageName, err)
	}
	if slices.Contains(r.names(), tag.Name()) {
		return fmt.Errorf("image %s is defined twice", tag)
	}
	stored, err := storeTag(tag)
	if err != nil {
		return err
	}
	if err := remote.Push(stored, image, r.storeOptions()...); err != nil {
		return err
	}
	r.tags = append(r.tags, tag)
	return nil
}

// storeTag is where the store keeps the image tag.
func storeTag(tag name.Tag) (name.Tag, error) {
	repository, err := name.NewRepository(storeHost + "/" + tag.RegistryStr() + "/" + tag.RepositoryStr())
	return repository.Tag(tag.TagStr()), err
}

func (r *registry) storeOptions() []remote.Option {
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

// names returns the served image names, sorted.
func (r *registry) names() []string {
	var names []string
	for _, tag := range r.tags {
		names = append(names, tag.Name())
	}
	slices.Sort(names)
	return names
}

// hosts returns the registry hosts of the served images, sorted: the hosts that need a
// hosts.toml.
func (r *registry) hosts() []string {
	var hosts []string
	for _, tag := range r.tags {
		hosts = append(hosts, tag.RegistryStr())
	}
	slices.Sort(hosts)
	return slices.Compact(hosts)
}

// ServeHTTP serves the pull side of the distribution API (GET and HEAD of /v2/, manifests by
// tag or digest, blobs) for the registry host the request names, and the other sites.
func (r *registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if site, ok := r.sites[requestHost(req)]; ok {
		r.log.Printf("%s %s%s", req.Method, req.Host, req.URL)
		site.ServeHTTP(w, req)
		return
	}
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

// Server serves a registry over TLS.
type Server struct {
	// Addr is the address the server listens on, host:port.
	Addr string
	// CACert is the PEM certificate of the CA that signed the server's certificate: what clients
	// trust.
	CACert []byte

	hosts  []string
	server *http.Server
	served chan error
}

// serveTLS serves r on listen (host:port; port 0 picks a free one) until Close, with a
// certificate for r's hosts and for the listening IP. Load archives and add aliases first.
func (r *registry) serveTLS(listen string) (*Server, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	var ips []net.IP
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsUnspecified() {
		ips = append(ips, ip)
	}
	hosts := r.hosts()
	tlsConfig, caCert, err := newCertificate(slices.Concat(hosts, slices.Sorted(maps.Keys(r.sites))), ips)
	if err != nil {
		ln.Close()
		return nil, err
	}
	s := &Server{
		Addr:   ln.Addr().String(),
		CACert: caCert,
		hosts:  hosts,
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

// WriteHostsDir makes dir a registry config_path of containerd that sends the pulls of every
// served host here: dir/<host>/hosts.toml names the server and the CA file, dir/registry-ca.pem.
// The server's address is an IP, so containerd names the host in the ns parameter.
func (s *Server) WriteHostsDir(dir string) error {
	caFile := filepath.Join(dir, "registry-ca.pem")
	if err := writeFile(caFile, s.CACert); err != nil {
		return err
	}
	for _, host := range s.hosts {
		hostsToml := fmt.Sprintf("# %s: served by knext's test registry.\nserver = \"https://%s\"\nca = %q\n", host, s.Addr, caFile)
		if err := writeFile(filepath.Join(dir, host, "hosts.toml"), []byte(hostsToml)); err != nil {
			return err
		}
	}
	return nil
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
		if header.Typeflag != tar.TypeReg {
			continue
		}
		file := path.Clean(header.Name)
		if !filepath.IsLocal(file) {
			return fmt.Errorf("%s points outside the archive", header.Name)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		if err := writeFile(filepath.Join(dir, file), data); err != nil {
			return err
		}
	}
}

// writeFile writes file name, and its directory.
func writeFile(name string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	return os.WriteFile(name, data, 0o644)
}
