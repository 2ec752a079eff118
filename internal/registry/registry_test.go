package registry

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/knext-dev/knext/internal/ociimage"
)

const (
	pauseName = "knext.local/pause:3.10"
	// aliasName stands for upstream's default sandbox image, served with the local pause image.
	aliasName = "registry.k8s.io/pause:3.10.2"
)

var pauseImage = ociimage.Image{
	Names:  []string{pauseName},
	Layers: []ociimage.Layer{{ociimage.RegularFile("pause", 0o755, []byte("pause"))}},
	Config: v1.Config{Entrypoint: []string{"/pause"}},
}

// writeArchive writes images to an archive and returns its path.
func writeArchive(t *testing.T, images ...ociimage.Image) string {
	t.Helper()
	archive := filepath.Join(t.TempDir(), "images.tar")
	if err := ociimage.WriteArchiveFile(archive, images...); err != nil {
		t.Fatal(err)
	}
	return archive
}

func testRegistry(t *testing.T) *registry {
	return newRegistry(log.New(t.Output(), "", 0))
}

// serve serves pauseImage, also as aliasName, and closes the server when the test ends.
func serve(t *testing.T) *Server {
	t.Helper()
	srv, err := Serve(Options{
		Listen:   "127.0.0.1:0",
		Archives: []string{writeArchive(t, pauseImage)},
		Aliases:  map[string]string{aliasName: pauseName},
		Log:      log.New(t.Output(), "", 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	})
	return srv
}

// client returns an HTTP client that trusts only the server's CA and reaches the server for
// every host name, as a private /etc/hosts does.
func client(t *testing.T, srv *Server) *http.Client {
	t.Helper()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(srv.CACert) {
		t.Fatal("the CA certificate is not valid PEM")
	}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, srv.Addr)
		},
	}}
}

func TestPullsByTagDigestAndAliasOverTLS(t *testing.T) {
	srv := serve(t)
	digest, err := pauseImage.Digest()
	if err != nil {
		t.Fatal(err)
	}
	transport := remote.WithTransport(client(t, srv).Transport)

	for _, ref := range []string{pauseName, aliasName, "knext.local/pause@" + digest.String(), "registry.k8s.io/pause@" + digest.String()} {
		parsed, err := name.ParseReference(ref, name.StrictValidation)
		if err != nil {
			t.Fatal(err)
		}
		head, err := remote.Head(parsed, transport)
		if err != nil {
			t.Errorf("HEAD %s: %v", ref, err)
			continue
		}
		if head.Digest != digest || head.MediaType != "application/vnd.oci.image.manifest.v1+json" {
			t.Errorf("HEAD %s: %s %s, want %s, an OCI manifest", ref, head.Digest, head.MediaType, digest)
		}
		image, err := remote.Image(parsed, transport)
		if err != nil {
			t.Errorf("GET %s: %v", ref, err)
			continue
		}
		layers, err := image.Layers()
		if err != nil || len(layers) != 1 {
			t.Errorf("GET %s: layers %v, %v; want one", ref, layers, err)
			continue
		}
		content, err := layers[0].Compressed()
		if err != nil {
			t.Errorf("GET %s: layer blob: %v", ref, err)
			continue
		}
		data, err := io.ReadAll(content)
		content.Close()
		if err != nil || !bytes.Contains(data, []byte("pause")) {
			t.Errorf("GET %s: layer blob %q, %v; want the pause layer", ref, data, err)
		}
	}

	// The certificate covers only the served hosts and the listening IP.
	if _, err := remote.Head(name.MustParseReference("other.example/pause:3.10"), transport); err == nil ||
		!strings.Contains(err.Error(), "certificate") {
		t.Errorf("HEAD on a host the certificate does not cover: err = %v, want a certificate error", err)
	}
}

// TestMirrorRequestsNameTheirHost pulls as containerd does through a hosts.toml naming the
// server by IP: the ns parameter, not the Host header, names the registry.
func TestMirrorRequestsNameTheirHost(t *testing.T) {
	srv := serve(t)
	c := client(t, srv)
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodGet, "/v2/", http.StatusOK},
		{http.MethodGet, "/v2/pause/manifests/3.10.2?ns=registry.k8s.io", http.StatusOK},
		{http.MethodHead, "/v2/pause/manifests/3.10?ns=knext.local", http.StatusOK},
		{http.MethodGet, "/v2/pause/manifests/3.10?ns=registry.k8s.io", http.StatusNotFound},
		{http.MethodGet, "/v2/pause/manifests/latest?ns=knext.local", http.StatusNotFound},
		{http.MethodGet, "/v2/pause/manifests/3.10?ns=other.example", http.StatusNotFound},
		{http.MethodGet, "/v2/pause/blobs/sha256:" + strings.Repeat("0", 64) + "?ns=knext.local", http.StatusNotFound},
		{http.MethodPut, "/v2/pause/manifests/3.11?ns=knext.local", http.StatusMethodNotAllowed},
		{http.MethodPost, "/v2/pause/blobs/uploads/?ns=knext.local", http.StatusMethodNotAllowed},
	} {
		req, err := http.NewRequest(tc.method, "https://"+srv.Addr+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Errorf("%s %s: %v", tc.method, tc.path, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s %s: status %d, want %d", tc.method, tc.path, resp.StatusCode, tc.status)
		}
	}
}

func TestWriteHostsDirPointsEveryHostAtTheServer(t *testing.T) {
	srv := serve(t)
	dir := t.TempDir()
	if err := srv.WriteHostsDir(dir); err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(dir, "registry-ca.pem"))
	if err != nil || !bytes.Equal(ca, srv.CACert) {
		t.Errorf("registry-ca.pem: %v, want the server's CA certificate", err)
	}
	for _, host := range []string{"knext.local", "registry.k8s.io"} {
		hostsToml, err := os.ReadFile(filepath.Join(dir, host, "hosts.toml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`server = "https://` + srv.Addr + `"`, `ca = "` + filepath.Join(dir, "registry-ca.pem") + `"`} {
			if !strings.Contains(string(hostsToml), want+"\n") {
				t.Errorf("%s/hosts.toml:\n%s\nwant the line %s", host, hostsToml, want)
			}
		}
	}
}

func TestHostsAndNames(t *testing.T) {
	reg := testRegistry(t)
	other := pauseImage
	other.Names = []string{"other.example/tools/pause:1", "knext.local/pause:latest"}
	if err := reg.loadArchive(writeArchive(t, pauseImage, other)); err != nil {
		t.Fatal(err)
	}
	if err := reg.addAlias(aliasName, pauseName); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(reg.hosts(), " "), "knext.local other.example registry.k8s.io"; got != want {
		t.Errorf("hosts %q, want %q", got, want)
	}
	if got, want := strings.Join(reg.names(), " "), "knext.local/pause:3.10 knext.local/pause:latest other.example/tools/pause:1 "+aliasName; got != want {
		t.Errorf("names %q, want %q", got, want)
	}
}

func TestRejectsBadArchivesAndAliases(t *testing.T) {
	good := writeArchive(t, pauseImage)
	reg := testRegistry(t)
	if err := reg.loadArchive(good); err != nil {
		t.Fatal(err)
	}
	if err := reg.loadArchive(good); err == nil || !strings.Contains(err.Error(), "defined twice") {
		t.Errorf("loading the same image twice: err = %v, want 'defined twice'", err)
	}
	if err := reg.addAlias(aliasName, "knext.local/pause:9"); err == nil || !strings.Contains(err.Error(), pauseName) {
		t.Errorf("alias of a missing image: err = %v, want it to list the images it has", err)
	}
	if err := reg.addAlias("pause:3.10.2", pauseName); err == nil {
		t.Error("alias without a registry host was accepted")
	}

	if err := testRegistry(t).loadArchive(tamper(t, good)); err == nil {
		t.Error("an archive with a tampered layer was loaded")
	}
	notLayout := filepath.Join(t.TempDir(), "empty.tar")
	if err := os.WriteFile(notLayout, make([]byte, 1024), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := testRegistry(t).loadArchive(notLayout); err == nil || !strings.Contains(err.Error(), "not an OCI image layout") {
		t.Errorf("loading an empty tar: err = %v, want 'not an OCI image layout'", err)
	}
}

// tamper returns a copy of archive whose layer blob holds other bytes than its digest says.
func tamper(t *testing.T, archive string) string {
	t.Helper()
	in, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var out bytes.Buffer
	tr, tw := tar.NewReader(in), tar.NewWriter(&out)
	for {
		header, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		// The layer is the only blob holding the file "pause".
		if strings.HasPrefix(header.Name, "blobs/") && bytes.Contains(data, []byte("pause\x00")) {
			data = bytes.Replace(data, []byte("pause"), []byte("PAUSE"), 1)
		}
		if err := tw.WriteHeader(header); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	tampered := filepath.Join(t.TempDir(), "tampered.tar")
	if err := os.WriteFile(tampered, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return tampered
}

// A site is served for its host, over TLS with the same certificate, beside the images.
func TestServesOtherSites(t *testing.T) {
	srv, err := Serve(Options{
		Listen:   "127.0.0.1:0",
		Archives: []string{writeArchive(t, pauseImage)},
		Sites: map[string]http.Handler{"downloads.example": http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			w.Header().Set("Requested-Path", req.URL.Path)
			io.WriteString(w, "downloads.example")
		})},
		Log: log.New(t.Output(), "", 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := client(t, srv)
	resp, err := c.Get("https://downloads.example/release.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if path := resp.Header.Get("Requested-Path"); resp.StatusCode != http.StatusOK || string(body) != "downloads.example" || path != "/release.tar.gz" {
		t.Errorf("GET of the site: %d %q for path %q", resp.StatusCode, body, path)
	}
	if _, err := remote.Head(name.MustParseReference(pauseName), remote.WithTransport(c.Transport)); err != nil {
		t.Errorf("the images are still served beside the site: %v", err)
	}
}
