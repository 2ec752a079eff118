package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/knext-dev/knext/contrib/images/registry"
	"github.com/knext-dev/knext/internal/harness/testimages"
)

// TestCertificateVerifiesForServedHosts runs a registry behind the generated certificate and
// pulls a manifest through a client that trusts only that certificate.
func TestCertificateVerifiesForServedHosts(t *testing.T) {
	archive := filepath.Join(t.TempDir(), "pause.tar")
	image := testimages.Image{
		Names:  []string{"knext.local/pause:3.10"},
		Layers: []testimages.Layer{{testimages.RegularFile("pause", 0o755, []byte("pause"))}},
	}
	if err := testimages.WriteArchiveFile(archive, image); err != nil {
		t.Fatal(err)
	}
	reg := registry.New()
	reg.Logf = t.Logf
	if err := reg.LoadArchive(archive); err != nil {
		t.Fatal(err)
	}
	tlsConfig, certPEM, err := selfSignedTLS(reg.Hosts())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(reg)
	srv.TLS = tlsConfig
	srv.StartTLS()
	defer srv.Close()

	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(certPEM) {
		t.Fatal("generated certificate is not valid PEM")
	}
	client := func(serverName string) *http.Client {
		return &http.Client{Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: serverName},
			DialContext: func(_ context.Context, network, _ string) (net.Conn, error) {
				return net.Dial(network, srv.Listener.Addr().String())
			},
		}}
	}
	resp, err := client("knext.local").Get("https://knext.local/v2/pause/manifests/3.10")
	if err != nil {
		t.Fatalf("TLS pull from knext.local: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"schemaVersion":2`) {
		t.Errorf("TLS pull: status %d, body %q, want the manifest", resp.StatusCode, body)
	}
	if _, err := client("registry.k8s.io").Get("https://registry.k8s.io/v2/"); err == nil {
		t.Error("certificate verified for a host it does not cover")
	}
}
