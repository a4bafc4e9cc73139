package kafkasec

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrRefused is wrapped by every *AuthError: the brokers refused this
// client's credentials, or the client refused the brokers' certificate. No
// retry can fix that; an operator must.
var ErrRefused = errors.New("connection refused by authentication")

// AuthError says which step of connecting was refused, and why.
type AuthError struct {
	Broker string // the broker's address
	// Step is "tls" (a certificate was refused, on either side) or "sasl".
	Step string
	// Reason says what went wrong, in words an operator acts on.
	Reason string
	// Err is the underlying error (a Kafka error code, an x509 error).
	Err error
}

// Error names the broker, the step and the reason.
func (e *AuthError) Error() string {
	s := fmt.Sprintf("%s with broker %s refused: %s", strings.ToUpper(e.Step), e.Broker, e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns ErrRefused and the underlying error.
func (e *AuthError) Unwrap() []error { return []error{ErrRefused, e.Err} }

// probeTimeout bounds one Check.
const probeTimeout = 5 * time.Second

// Check connects once to the first of brokers that answers, and goes as
// far as a client must before its first real request: the TLS handshake
// and an ApiVersions request, then the SASL handshake and authentication.
// It returns nil when all of that succeeds, an *AuthError (wrapping
// ErrRefused) when a step is refused, and another error when no broker
// could be reached. It is one connection, so a client that checks before
// it connects meets a wrong password with one attempt, not with each of
// its own retries.
//
// Some brokers (the dev broker among them) close the connection instead
// of answering a failed authentication with SASL_AUTHENTICATION_FAILED;
// Check reports that as refused too, since it comes right after the
// credentials were sent.
func (s Settings) Check(ctx context.Context, brokers []string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var errs []error
	for _, b := range brokers {
		err := s.checkOne(ctx, b)
		var ae *AuthError
		if err == nil || errors.As(err, &ae) {
			return err
		}
		errs = append(errs, fmt.Errorf("broker %s: %w", b, err))
		if ctx.Err() != nil {
			break
		}
	}
	return errors.Join(errs...)
}

func (s Settings) checkOne(ctx context.Context, broker string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", broker)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if s.TLS != nil {
		if conn, err = s.handshake(ctx, conn, broker); err != nil {
			return err
		}
	}
	p := &prober{conn: conn, broker: broker, f: kmsg.NewRequestFormatter(kmsg.FormatterClientID("outboxd-check"))}
	if err := p.apiVersions(); err != nil {
		if s.TLS != nil && isRemoteTLSAlert(err) {
			// TLS 1.3 clients learn that the broker refused their
			// certificate only on the first read.
			return &AuthError{Broker: broker, Step: "tls", Reason: "the broker refused this client's certificate", Err: err}
		}
		if s.TLS == nil && isClosed(err) {
			// A TLS listener reads the request as a bad handshake and hangs
			// up: not an outage, a missing setting.
			return fmt.Errorf("%w: the broker closed the connection at once, as a TLS listener does to a client "+
				"speaking plaintext: is TLS missing (--kafka-tls)?", err)
		}
		return err
	}
	if s.SASL.Mechanism == "" {
		return nil
	}
	return p.sasl(ctx, s)
}

// handshake runs the TLS handshake on conn.
func (s Settings) handshake(ctx context.Context, conn net.Conn, broker string) (net.Conn, error) {
	tc := s.TLS.Clone()
	if tc.ServerName == "" {
		host, _, _ := net.SplitHostPort(broker)
		tc.ServerName = host
	}
	t := tls.Client(conn, tc)
	err := t.HandshakeContext(ctx)
	switch {
	case err == nil:
		return t, nil
	case isCertError(err):
		return nil, &AuthError{Broker: broker, Step: "tls", Reason: "the broker's certificate is not trusted (check --kafka-tls-ca and --kafka-tls-server-name)", Err: err}
	case isRemoteTLSAlert(err):
		return nil, &AuthError{Broker: broker, Step: "tls", Reason: "the broker refused the TLS handshake", Err: err}
	}
	return nil, fmt.Errorf("TLS handshake: %w", err)
}

func isCertError(err error) bool {
	var ve *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	var ci x509.CertificateInvalidError
	return errors.As(err, &ve) || errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci)
}

// isRemoteTLSAlert reports an alert the peer sent (crypto/tls does not
// export its type for TCP connections, only its text).
func isRemoteTLSAlert(err error) bool {
	return err != nil && strings.Contains(err.Error(), "remote error: tls:")
}

// prober speaks just enough of the Kafka protocol to authenticate.
type prober struct {
	conn   net.Conn
	broker string
	f      *kmsg.RequestFormatter
	corr   int32
}

// roundTrip sends req and reads resp (versions without flexible headers).
func (p *prober) roundTrip(req kmsg.Request, resp kmsg.Response) error {
	p.corr++
	if _, err := p.conn.Write(p.f.AppendRequest(nil, req, p.corr)); err != nil {
		return err
	}
	var size [4]byte
	if _, err := io.ReadFull(p.conn, size[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n < 4 || n > 1<<20 {
		return fmt.Errorf("response of %d bytes: not Kafka", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(p.conn, body); err != nil {
		return err
	}
	if int32(binary.BigEndian.Uint32(body)) != p.corr {
		return errors.New("response to another request: not Kafka")
	}
	resp.SetVersion(req.GetVersion())
	return resp.ReadFrom(body[4:])
}

func (p *prober) apiVersions() error {
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 0
	resp := kmsg.NewPtrApiVersionsResponse()
	if err := p.roundTrip(req, resp); err != nil {
		return fmt.Errorf("ApiVersions: %w", err)
	}
	return nil
}

func (p *prober) refused(reason string, err error) error {
	return &AuthError{Broker: p.broker, Step: "sasl", Reason: reason, Err: err}
}

// sasl runs the SASL handshake and authentication of s.
func (p *prober) sasl(ctx context.Context, s Settings) error {
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.Version = 1
	hs.Mechanism = s.SASL.Mechanism
	hsResp := kmsg.NewPtrSASLHandshakeResponse()
	if err := p.roundTrip(hs, hsResp); err != nil {
		return fmt.Errorf("SASL handshake: %w", err)
	}
	if err := kerr.ErrorForCode(hsResp.ErrorCode); err != nil {
		return p.refused(fmt.Sprintf("the broker does not offer %s (it offers %s)", s.SASL.Mechanism,
			strings.Join(hsResp.SupportedMechanisms, ", ")), err)
	}
	sess, msg, err := s.mechanism().Authenticate(ctx, p.broker)
	if err != nil {
		return fmt.Errorf("SASL %s: %w", s.SASL.Mechanism, err)
	}
	who := fmt.Sprintf("SASL %s as %q", s.SASL.Mechanism, s.SASL.User)
	for {
		req := kmsg.NewPtrSASLAuthenticateRequest()
		req.Version = 1
		req.SASLAuthBytes = msg
		resp := kmsg.NewPtrSASLAuthenticateResponse()
		if err := p.roundTrip(req, resp); err != nil {
			if isClosed(err) {
				return p.refused(who+": the broker closed the connection on the credentials (wrong user or password?)", nil)
			}
			return fmt.Errorf("SASL authenticate: %w", err)
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			reason := who + ": wrong user or password?"
			if resp.ErrorMessage != nil {
				reason = who + ": " + *resp.ErrorMessage
			}
			return p.refused(reason, err)
		}
		done, next, err := sess.Challenge(resp.SASLAuthBytes)
		if err != nil {
			return p.refused(who+": the broker's answer does not verify", err)
		}
		if done {
			return nil
		}
		msg = next
	}
}

func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "connection reset")
}
