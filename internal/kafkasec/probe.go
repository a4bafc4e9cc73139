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

	"github.com/IBM/sarama"
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

// TLSMissingHint explains a connection a broker closed at once to a
// plaintext client.
const TLSMissingHint = "the broker closed the connection at once, as a TLS listener does to a client " +
	"speaking plaintext: is TLS missing (--kafka-tls)?"

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
	p := &prober{conn: conn, broker: broker}
	if err := p.apiVersions(); err != nil {
		if s.TLS != nil && isRemoteTLSAlert(err) {
			// TLS 1.3 clients learn that the broker refused their
			// certificate only on the first read.
			return &AuthError{Broker: broker, Step: "tls", Reason: "the broker refused this client's certificate", Err: err}
		}
		if s.TLS == nil && isClosed(err) {
			// A TLS listener reads the request as a bad handshake and hangs
			// up: not an outage, a missing setting.
			return fmt.Errorf("%w: %s", err, TLSMissingHint)
		}
		return err
	}
	if s.SASL.Mechanism == "" {
		return nil
	}
	return p.sasl(s)
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

// prober speaks just enough of the Kafka protocol to authenticate: the
// three requests, in versions without flexible headers, encoded here.
type prober struct {
	conn   net.Conn
	broker string
	corr   int32
}

// Kafka API keys and versions of the requests the prober sends.
const (
	apiKeySASLHandshake    = 17
	apiKeyAPIVersions      = 18
	apiKeySASLAuthenticate = 36
	proberClientID         = "outboxd-check"
)

// roundTrip sends a request of key and version with body and returns the
// response's body, past its correlation id.
func (p *prober) roundTrip(key, version int16, body []byte) (*wire, error) {
	p.corr++
	req := binary.BigEndian.AppendUint32(make([]byte, 0, 64+len(body)), 0) // size, set below
	req = binary.BigEndian.AppendUint16(req, uint16(key))
	req = binary.BigEndian.AppendUint16(req, uint16(version))
	req = binary.BigEndian.AppendUint32(req, uint32(p.corr))
	req = appendString(req, proberClientID)
	req = append(req, body...)
	binary.BigEndian.PutUint32(req, uint32(len(req)-4))
	if _, err := p.conn.Write(req); err != nil {
		return nil, err
	}
	var size [4]byte
	if _, err := io.ReadFull(p.conn, size[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n < 4 || n > 1<<20 {
		return nil, fmt.Errorf("response of %d bytes: not Kafka", n)
	}
	resp := make([]byte, n)
	if _, err := io.ReadFull(p.conn, resp); err != nil {
		return nil, err
	}
	if int32(binary.BigEndian.Uint32(resp)) != p.corr {
		return nil, errors.New("response to another request: not Kafka")
	}
	return &wire{b: resp[4:]}, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// wire reads a response's fields; the first field that does not fit
// makes err say so, and every later read returns zero.
type wire struct {
	b   []byte
	err error
}

func (w *wire) take(n int) []byte {
	if w.err != nil || n < 0 || n > len(w.b) {
		if w.err == nil {
			w.err = errors.New("response too short: not Kafka")
		}
		return nil
	}
	v := w.b[:n]
	w.b = w.b[n:]
	return v
}

func (w *wire) int16() int16 {
	if v := w.take(2); v != nil {
		return int16(binary.BigEndian.Uint16(v))
	}
	return 0
}

func (w *wire) int32() int32 {
	if v := w.take(4); v != nil {
		return int32(binary.BigEndian.Uint32(v))
	}
	return 0
}

// string reads a (nullable) string; null reads as "".
func (w *wire) string() string {
	n := w.int16()
	if n < 0 {
		return ""
	}
	return string(w.take(int(n)))
}

func (w *wire) bytes() []byte {
	n := w.int32()
	if n < 0 {
		return nil
	}
	return w.take(int(n))
}

// kafkaError is code as an error, nil for none.
func kafkaError(code int16) error {
	if code == 0 {
		return nil
	}
	return sarama.KError(code)
}

func (p *prober) apiVersions() error {
	if _, err := p.roundTrip(apiKeyAPIVersions, 0, nil); err != nil {
		return fmt.Errorf("ApiVersions: %w", err)
	}
	return nil
}

func (p *prober) refused(reason string, err error) error {
	return &AuthError{Broker: p.broker, Step: "sasl", Reason: reason, Err: err}
}

// saslSession is one authentication's conversation: Step answers the
// broker's last message ("" first) with the client's next one.
type saslSession interface {
	Step(challenge string) (string, error)
	Done() bool
}

// plainSession is SASL PLAIN: one message, the user and the password.
type plainSession struct {
	user, password string
	sent           bool
}

func (s *plainSession) Step(string) (string, error) {
	if s.sent {
		return "", nil
	}
	s.sent = true
	return "\x00" + s.user + "\x00" + s.password, nil
}

func (s *plainSession) Done() bool { return s.sent }

// session starts s's SASL conversation.
func (s Settings) session() (saslSession, error) {
	if s.SASL.Mechanism == MechanismPlain {
		return &plainSession{user: s.SASL.User, password: string(s.SASL.Password)}, nil
	}
	c := &scramClient{sha512: s.SASL.Mechanism == MechanismSCRAMSHA512}
	return c, c.Begin(s.SASL.User, string(s.SASL.Password), "")
}

// sasl runs the SASL handshake and authentication of s.
func (p *prober) sasl(s Settings) error {
	hs, err := p.roundTrip(apiKeySASLHandshake, 1, appendString(nil, s.SASL.Mechanism))
	if err != nil {
		return fmt.Errorf("SASL handshake: %w", err)
	}
	code := hs.int16()
	var offered []string
	for n := hs.int32(); n > 0 && hs.err == nil; n-- {
		offered = append(offered, hs.string())
	}
	if hs.err != nil {
		return fmt.Errorf("SASL handshake: %w", hs.err)
	}
	if err := kafkaError(code); err != nil {
		return p.refused(fmt.Sprintf("the broker does not offer %s (it offers %s)", s.SASL.Mechanism,
			strings.Join(offered, ", ")), err)
	}
	sess, err := s.session()
	if err != nil {
		return fmt.Errorf("SASL %s: %w", s.SASL.Mechanism, err)
	}
	first, err := sess.Step("")
	msg := []byte(first)
	if err != nil {
		return fmt.Errorf("SASL %s: %w", s.SASL.Mechanism, err)
	}
	who := fmt.Sprintf("SASL %s as %q", s.SASL.Mechanism, s.SASL.User)
	for {
		body := binary.BigEndian.AppendUint32(nil, uint32(len(msg)))
		resp, err := p.roundTrip(apiKeySASLAuthenticate, 1, append(body, msg...))
		if err != nil {
			if isClosed(err) {
				return p.refused(who+": the broker closed the connection on the credentials (wrong user or password?)", nil)
			}
			return fmt.Errorf("SASL authenticate: %w", err)
		}
		code, nullable := resp.int16(), resp.int16()
		var errMsg *string
		if nullable >= 0 {
			m := string(resp.take(int(nullable)))
			errMsg = &m
		}
		answer := resp.bytes()
		if resp.err != nil {
			return fmt.Errorf("SASL authenticate: %w", resp.err)
		}
		if err := kafkaError(code); err != nil {
			reason := who + ": wrong user or password?"
			if errMsg != nil {
				reason = who + ": " + *errMsg
			}
			return p.refused(reason, err)
		}
		if sess.Done() {
			return nil
		}
		next, err := sess.Step(string(answer))
		if err != nil {
			return p.refused(who+": the broker's answer does not verify", err)
		}
		if sess.Done() {
			return nil
		}
		msg = []byte(next)
	}
}

func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "connection reset")
}
