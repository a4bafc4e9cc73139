package api

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// EnvAdminToken is the environment variable that may hold the admin token.
const EnvAdminToken = "OUTBOXD_ADMIN_TOKEN"

// LoadAdminToken returns the admin token from the file at path (its content,
// surrounding white space trimmed) or from the environment variable
// EnvAdminToken, read through getenv. Setting both is an error, so a token
// is never silently ignored; setting neither returns "" (admin endpoints
// disabled). The token is checked as Config.Validate checks it.
func LoadAdminToken(path string, getenv func(string) string) (string, error) {
	env := strings.TrimSpace(getenv(EnvAdminToken))
	if path == "" {
		if env == "" {
			return "", nil
		}
		if err := checkToken(env); err != nil {
			return "", fmt.Errorf("%s: %w", EnvAdminToken, err)
		}
		return env, nil
	}
	if env != "" {
		return "", fmt.Errorf("--admin-token-file and %s are both set: give one", EnvAdminToken)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--admin-token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", errors.New("--admin-token-file: the file is empty")
	}
	if err := checkToken(tok); err != nil {
		return "", fmt.Errorf("--admin-token-file %s: %w", path, err)
	}
	return tok, nil
}
