// Package testcerts makes throwaway certificates for tests: a CA, a server
// certificate for 127.0.0.1 and localhost, client certificates, written as
// PEM files, so TLS is tested with real handshakes and nothing is checked
// in.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority made for one test.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte
	// File is its certificate as a PEM file.
	File string
	dir  string
}

// Pair is a certificate signed by a CA, with its key, in memory and as PEM
// files.
type Pair struct {
	TLS      tls.Certificate
	CertFile string
	KeyFile  string
}

// NewCA makes a CA named name and writes its certificate into dir.
func NewCA(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{cert: cert, key: key, der: der, dir: dir, File: filepath.Join(dir, name+"-ca.pem")}
	return ca, writePEM(ca.File, "CERTIFICATE", der)
}

// Pool is a pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Server makes a server certificate for 127.0.0.1, ::1, localhost and the
// extra DNS names.
func (ca *CA) Server(name string, dnsNames ...string) (*Pair, error) {
	return ca.issue(name, x509.ExtKeyUsageServerAuth, append([]string{"localhost"}, dnsNames...),
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback})
}

// Client makes a client certificate whose subject's common name is cn.
func (ca *CA) Client(cn string) (*Pair, error) {
	return ca.issue(cn, x509.ExtKeyUsageClientAuth, nil, nil)
}

func (ca *CA) issue(cn string, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (*Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	p := &Pair{CertFile: filepath.Join(ca.dir, cn+".pem"), KeyFile: filepath.Join(ca.dir, cn+"-key.pem")}
	if err := writePEM(p.CertFile, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if err := writePEM(p.KeyFile, "PRIVATE KEY", keyDER); err != nil {
		return nil, err
	}
	if p.TLS, err = tls.LoadX509KeyPair(p.CertFile, p.KeyFile); err != nil {
		return nil, fmt.Errorf("load %s: %w", cn, err)
	}
	return p, nil
}

// ServerTLS is a listener's TLS configuration for pair; with clients set,
// it requires a client certificate signed by clients.
func ServerTLS(pair *Pair, clients *CA) *tls.Config {
	c := &tls.Config{Certificates: []tls.Certificate{pair.TLS}, MinVersion: tls.VersionTLS12}
	if clients != nil {
		c.ClientCAs = clients.Pool()
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
