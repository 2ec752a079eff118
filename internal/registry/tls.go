package registry

import (
	"crypto/tls"
	"net"
	"time"

	"github.com/knext-dev/knext/internal/pki"
)

// newCertificate generates a throwaway CA and a server certificate it signs for hosts and ips,
// and returns the server's TLS configuration and the CA's PEM certificate. Both expire after a
// day: a test registry lives for one run.
func newCertificate(hosts []string, ips []net.IP) (*tls.Config, []byte, error) {
	ca, err := pki.NewAuthority("knext test registry CA", 24*time.Hour)
	if err != nil {
		return nil, nil, err
	}
	cert, err := ca.Issue(pki.Request{CommonName: "knext test registry", DNSNames: hosts, IPs: ips, Server: true})
	if err != nil {
		return nil, nil, err
	}
	pair, err := cert.TLS()
	if err != nil {
		return nil, nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, ca.PEM, nil
}
