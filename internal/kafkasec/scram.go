package kafkasec

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
)

// scramClient is the client side of a SCRAM conversation (RFC 5802) with
// SHA-256 or SHA-512, as Kafka's SCRAM-SHA-256 and SCRAM-SHA-512 speak it:
// sarama's SASL/SCRAM authentication and Check's both carry it out.
type scramClient struct {
	sha512 bool

	user, password, authzID string
	nonce                   string
	clientFirstBare         string
	serverSignature         []byte
	step                    int
	done                    bool
}

// maxSCRAMIterations bounds the server's iteration count, which the
// client's PBKDF2 pays for.
const maxSCRAMIterations = 1 << 20

// Begin starts a conversation as user.
func (c *scramClient) Begin(user, password, authzID string) error {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("scram: nonce: %w", err)
	}
	c.user, c.password, c.authzID = user, password, authzID
	c.nonce = base64.RawStdEncoding.EncodeToString(b[:])
	c.step, c.done, c.serverSignature = 0, false, nil
	return nil
}

func (c *scramClient) hash() func() hash.Hash {
	if c.sha512 {
		return sha512.New
	}
	return sha256.New
}

func (c *scramClient) gs2Header() string {
	if c.authzID == "" {
		return "n,,"
	}
	return "n,a=" + saslName(c.authzID) + ","
}

// Step answers the server's challenge: it is called first with "" for the
// client's first message, then with each of the server's messages.
func (c *scramClient) Step(challenge string) (string, error) {
	switch c.step {
	case 0:
		c.step++
		c.clientFirstBare = "n=" + saslName(c.user) + ",r=" + c.nonce
		return c.gs2Header() + c.clientFirstBare, nil
	case 1:
		c.step++
		return c.clientFinal(challenge)
	case 2:
		c.step++
		attrs := scramAttrs(challenge)
		if e, ok := attrs["e"]; ok {
			return "", fmt.Errorf("scram: the server refused: %s", e)
		}
		v, err := base64.StdEncoding.DecodeString(attrs["v"])
		if err != nil || !hmac.Equal(v, c.serverSignature) {
			return "", errors.New("scram: the server's signature does not verify")
		}
		c.done = true
		return "", nil
	}
	return "", errors.New("scram: the conversation is over")
}

// clientFinal answers the server's first message.
func (c *scramClient) clientFinal(serverFirst string) (string, error) {
	attrs := scramAttrs(serverFirst)
	if _, ok := attrs["m"]; ok {
		return "", errors.New("scram: the server asks for an extension this client does not know")
	}
	nonce := attrs["r"]
	if !strings.HasPrefix(nonce, c.nonce) || len(nonce) == len(c.nonce) {
		return "", errors.New("scram: the server's nonce does not extend the client's")
	}
	salt, err := base64.StdEncoding.DecodeString(attrs["s"])
	if err != nil || len(salt) == 0 {
		return "", errors.New("scram: the server's salt does not decode")
	}
	iter, err := strconv.Atoi(attrs["i"])
	if err != nil || iter < 1 || iter > maxSCRAMIterations {
		return "", fmt.Errorf("scram: iteration count %q out of range", attrs["i"])
	}
	h := c.hash()
	salted, err := pbkdf2.Key(h, c.password, salt, iter, h().Size())
	if err != nil {
		return "", fmt.Errorf("scram: %w", err)
	}
	clientKey := hmacOf(h, salted, "Client Key")
	storedKey := h()
	storedKey.Write(clientKey)
	withoutProof := "c=" + base64.StdEncoding.EncodeToString([]byte(c.gs2Header())) + ",r=" + nonce
	authMessage := c.clientFirstBare + "," + serverFirst + "," + withoutProof
	signature := hmacOf(h, storedKey.Sum(nil), authMessage)
	proof := make([]byte, len(clientKey))
	subtle.XORBytes(proof, clientKey, signature)
	c.serverSignature = hmacOf(h, hmacOf(h, salted, "Server Key"), authMessage)
	return withoutProof + ",p=" + base64.StdEncoding.EncodeToString(proof), nil
}

// Done reports whether the server's final message was verified.
func (c *scramClient) Done() bool { return c.done }

func hmacOf(h func() hash.Hash, key []byte, msg string) []byte {
	m := hmac.New(h, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

// saslName escapes a user name for a SCRAM message.
func saslName(s string) string {
	return strings.NewReplacer("=", "=3D", ",", "=2C").Replace(s)
}

// scramAttrs splits a SCRAM message into its attributes.
func scramAttrs(msg string) map[string]string {
	m := map[string]string{}
	for _, kv := range strings.Split(msg, ",") {
		if len(kv) >= 2 && kv[1] == '=' {
			m[kv[:1]] = kv[2:]
		}
	}
	return m
}
