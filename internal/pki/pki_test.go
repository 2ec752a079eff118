package pki

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"testing"
	"time"
)

func TestIssuedCertificatesVerifyAgainstTheCA(t *testing.T) {
	ca, err := NewAuthority("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	serving, err := ca.Issue(Request{CommonName: "node-1", DNSNames: []string{"node-1"},
		IPs: []net.IP{net.ParseIP("10.200.1.11"), net.ParseIP("fd6b:6e63:ffff:c801::b")}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	cert := parseCert(t, serving.CertPEM)
	for _, host := range []string{"node-1", "10.200.1.11", "fd6b:6e63:ffff:c801::b"} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("serving certificate for %s: %v", host, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "node-2", Roots: roots}); err == nil {
		t.Error("the serving certificate of node-1 verifies for node-2")
	}
	client, err := ca.Issue(Request{CommonName: "system:node:node-1", Organizations: []string{"system:nodes"}})
	if err != nil {
		t.Fatal(err)
	}
	cert = parseCert(t, client.CertPEM)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("a client certificate verifies as a serving one")
	}
	if cert.Subject.CommonName != "system:node:node-1" || len(cert.Subject.Organization) != 1 || cert.Subject.Organization[0] != "system:nodes" {
		t.Errorf("client certificate subject %v, want CN system:node:node-1, O system:nodes", cert.Subject)
	}
}

func parseCert(t *testing.T, data []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("no PEM in %q", data)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
