// Package pki is the one certificate generator of knext's tools: a CA of their own and the
// serving and client certificates it signs, as PEM. The local cluster keeps its PKI on disk; the
// test registry serves TLS with a CA made for one run.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Authority is a CA: it signs every certificate its users trust it for.
type Authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA's certificate, for clients and servers to trust.
	PEM []byte
}

// Certificate is a key pair signed by an Authority, PEM-encoded.
type Certificate struct {
	CertPEM, KeyPEM []byte
}

// NewAuthority creates a CA named commonName that expires after validity; so do the
// certificates it issues.
func NewAuthority(commonName string, validity time.Duration) (*Authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	template := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA %s: %w", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Authority{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Write writes the CA as dir/ca.crt and dir/ca.key.
func (ca *Authority) Write(dir string) error {
	keyPEM, err := encodeKey(ca.key)
	if err != nil {
		return err
	}
	return errors.Join(WriteSecret(filepath.Join(dir, "ca.crt"), ca.PEM), WriteSecret(filepath.Join(dir, "ca.key"), keyPEM))
}

// Request describes one certificate: its subject and, for a serving certificate, the names and
// addresses it is valid for.
type Request struct {
	CommonName    string
	Organizations []string
	DNSNames      []string
	IPs           []net.IP
	Server        bool // serving certificate (else client only)
}

// Issue signs a new key pair for req, valid as long as the CA.
func (ca *Authority) Issue(req Request) (Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Certificate{}, err
	}
	serial, err := serialNumber()
	if err != nil {
		return Certificate{}, err
	}
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if req.Server {
		usage = append(usage, x509.ExtKeyUsageServerAuth)
	}
	template := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.CommonName, Organization: req.Organizations},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     ca.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usage,
		DNSNames:     req.DNSNames,
		IPAddresses:  req.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Certificate{}, fmt.Errorf("sign certificate for %s: %w", req.CommonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return Certificate{}, err
	}
	return Certificate{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: keyPEM}, nil
}

// Write writes the pair as dir/name.crt and dir/name.key.
func (c Certificate) Write(dir, name string) error {
	return errors.Join(WriteSecret(filepath.Join(dir, name+".crt"), c.CertPEM),
		WriteSecret(filepath.Join(dir, name+".key"), c.KeyPEM))
}

// TLS returns the pair for a tls.Config.
func (c Certificate) TLS() (tls.Certificate, error) {
	return tls.X509KeyPair(c.CertPEM, c.KeyPEM)
}

// WriteKeyPair writes a new key pair, signed by no one, as dir/name.key and dir/name.pub: the
// kind a Kubernetes API server signs and verifies service account tokens with.
func WriteKeyPair(dir, name string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	return errors.Join(WriteSecret(filepath.Join(dir, name+".key"), keyPEM),
		WriteSecret(filepath.Join(dir, name+".pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})))
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// WriteSecret writes a file only root reads, creating its directory.
func WriteSecret(name string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return err
	}
	return os.WriteFile(name, data, 0o600)
}
