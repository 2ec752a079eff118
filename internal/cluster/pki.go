package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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

	"sigs.k8s.io/yaml"
)

// certValidity is long enough for a cluster that is kept for a while, short enough to say "test".
const certValidity = 365 * 24 * time.Hour

// authority is the cluster CA: it signs every serving and client certificate, the API server and
// the kubelets trust it for clients, and the controller-manager signs CSRs with it.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

// certificate is a key pair signed by the authority, PEM-encoded.
type certificate struct {
	CertPEM, KeyPEM []byte
}

// newAuthority creates the CA and writes ca.crt and ca.key into dir.
func newAuthority(dir string) (*authority, error) {
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
		Subject:               pkix.Name{CommonName: "knext-cluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &authority{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return ca, errors.Join(writeSecret(filepath.Join(dir, "ca.crt"), ca.pem), writeSecret(filepath.Join(dir, "ca.key"), keyPEM))
}

// certRequest describes one certificate: its subject and, for a serving certificate, the names
// and addresses it is valid for.
type certRequest struct {
	commonName    string
	organizations []string
	dnsNames      []string
	ips           []net.IP
	server        bool // serving certificate (else client only)
}

// issue signs a new key pair for req.
func (ca *authority) issue(req certRequest) (certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return certificate{}, err
	}
	serial, err := serialNumber()
	if err != nil {
		return certificate{}, err
	}
	now := time.Now()
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if req.server {
		usage = append(usage, x509.ExtKeyUsageServerAuth)
	}
	template := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.commonName, Organization: req.organizations},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usage,
		DNSNames:     req.dnsNames,
		IPAddresses:  req.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return certificate{}, fmt.Errorf("sign certificate for %s: %w", req.commonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return certificate{}, err
	}
	return certificate{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: keyPEM}, nil
}

// write writes the pair as dir/name.crt and dir/name.key.
func (c certificate) write(dir, name string) error {
	return errors.Join(writeSecret(filepath.Join(dir, name+".crt"), c.CertPEM),
		writeSecret(filepath.Join(dir, name+".key"), c.KeyPEM))
}

// kubeconfig returns a kubeconfig for server that authenticates with c and trusts ca.
func (ca *authority) kubeconfig(server, user string, c certificate) ([]byte, error) {
	return yaml.Marshal(map[string]any{
		"apiVersion": "v1",
		"kind":       "Config",
		"clusters": []any{map[string]any{
			"name":    "knext",
			"cluster": map[string]any{"server": server, "certificate-authority-data": ca.pem},
		}},
		"users": []any{map[string]any{
			"name": user,
			"user": map[string]any{"client-certificate-data": c.CertPEM, "client-key-data": c.KeyPEM},
		}},
		"contexts": []any{map[string]any{
			"name":    user + "@knext",
			"context": map[string]any{"cluster": "knext", "user": user},
		}},
		"current-context": user + "@knext",
	})
}

// newServiceAccountKey writes the key pair the API server signs and verifies service account
// tokens with (sa.key, sa.pub) into dir.
func newServiceAccountKey(dir string) error {
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
	return errors.Join(writeSecret(filepath.Join(dir, "sa.key"), keyPEM),
		writeSecret(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})))
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

// writeSecret writes a file only root reads, creating its directory.
func writeSecret(name string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return err
	}
	return os.WriteFile(name, data, 0o600)
}
