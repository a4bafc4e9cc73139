package server

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/api"
)

// secretKey matches the YAML keys whose values are secrets: `server
// config` leaves them out (a path to a secret, such as adminTokenFile, is
// not one).
var secretKey = regexp.MustCompile(`(?i)(password|secret|token)$`)

// configCommand runs `server config [flags]`: it reads the configuration
// as the server would and prints the effective one as YAML.
func configCommand(args []string, stdout, stderr io.Writer, opts ...Option) int {
	cfg, err := ParseConfig(args, os.Getenv, opts...)
	if errors.Is(err, flag.ErrHelp) {
		helpOf(stdout, "config", "config [the server's flags]", nil)
		printFlagGroups(stdout)
		return ExitOK
	}
	if err != nil {
		return badUsage(stderr, err)
	}
	for _, w := range cfg.Warnings() {
		fmt.Fprintf(stderr, "%s: warning: %s\n", programName, w)
	}
	for _, u := range UnknownEnvs(os.Environ()) {
		if u.CommandLineOnly {
			fmt.Fprintf(stderr, "%s: warning: %s ignored: its flag is read from the command line only\n", programName, u.Name)
		} else {
			fmt.Fprintf(stderr, "%s: warning: unknown environment variable %s ignored (the closest is %s)\n", programName, u.Name, u.Closest)
		}
	}
	b, err := RenderConfig(cfg, os.Getenv(api.EnvAdminToken) != "")
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", programName, err)
		return ExitFailed
	}
	stdout.Write(b)
	return ExitOK
}

// RenderConfig writes c as YAML that --config reads back to the same
// configuration, each value with a comment saying where it came from
// (Config.Origin). Secret values (keys ending in password, secret or
// token) are left out and named in the header; so is a token taken from
// the environment (tokenFromEnv) and --new-database, which only the
// command line sets.
func RenderConfig(c Config, tokenFromEnv bool) ([]byte, error) {
	r := &renderer{c: &c}
	body := r.mapping(reflect.ValueOf(c), "")
	head := []string{
		"The configuration outboxd runs with: flags, OUTBOXD_* variables, the --config file and defaults merged.",
		"Each value's comment says where it came from. Give this file back with --config FILE.",
	}
	for _, k := range r.secrets {
		head = append(head, fmt.Sprintf("%s is set (%s) but not printed: give it again.", k, c.Origin(k)))
	}
	for _, k := range r.passwords {
		head = append(head, fmt.Sprintf("%s holds a password (%s), printed as %s: put it back, or keep it in a password file.", k, c.Origin(k), redacted))
	}
	if tokenFromEnv {
		head = append(head, "The admin token comes from "+api.EnvAdminToken+", not printed: set it again.")
	}
	if c.NewDatabase {
		head = append(head, "--new-database was given: only the command line sets it, so it is not kept here.")
	}
	doc := &yaml.Node{Kind: yaml.DocumentNode, HeadComment: strings.Join(head, "\n"), Content: []*yaml.Node{body}}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("write the configuration as YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("write the configuration as YAML: %w", err)
	}
	return buf.Bytes(), nil
}

// renderer builds the YAML nodes of a configuration.
type renderer struct {
	c         *Config
	secrets   []string // keys left out
	passwords []string // keys whose URL or DSN had its password replaced
}

// redacted stands for a password taken out of a URL or a DSN.
const redacted = "REDACTED"

// dsnPassword finds a password=... pair in a key/value connection string
// (PostgreSQL's libpq form: "host=db user=u password=p").
var dsnPassword = regexp.MustCompile(`(?i)(^|\s)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// redactPassword returns s with the password of a URL (scheme://user:pw@)
// or of a key/value DSN (password=pw) replaced by redacted, and whether it
// replaced one. Other text is returned unchanged.
func redactPassword(s string) (string, bool) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		if dsnPassword.MatchString(s) {
			return dsnPassword.ReplaceAllString(s, "${1}${2}"+redacted), true
		}
		return s, false
	}
	changed := false
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), redacted)
		changed = true
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", redacted)
		u.RawQuery = q.Encode()
		changed = true
	}
	if !changed {
		return s, false
	}
	return u.String(), true
}

func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v} }

// node renders v, found at key.
func (r *renderer) node(v reflect.Value, key string) *yaml.Node {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
		}
		v = v.Elem()
	}
	switch t := v.Type(); {
	case isValue(t):
		return r.value(v, key)
	case t.Kind() == reflect.Struct:
		return r.mapping(v, key)
	case t.Kind() == reflect.Map:
		n := &yaml.Node{Kind: yaml.MappingNode}
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
		for _, k := range keys {
			n.Content = append(n.Content, scalar(k.String()), r.node(v.MapIndex(k), join(key, k.String())))
		}
		if len(keys) == 0 {
			n.Style = yaml.FlowStyle
		}
		return n
	case t.Kind() == reflect.Slice:
		n := &yaml.Node{Kind: yaml.SequenceNode}
		for i := range v.Len() {
			n.Content = append(n.Content, r.node(v.Index(i), fmt.Sprintf("%s[%d]", key, i)))
		}
		return n
	}
	var n yaml.Node
	_ = n.Encode(v.Interface())
	return &n
}

// mapping renders a struct's fields, in their order.
func (r *renderer) mapping(v reflect.Value, key string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.MappingNode}
	r.fields(n, v, key)
	return n
}

// fields adds a struct's fields to the mapping n, an inline struct's
// fields as the struct's own.
func (r *renderer) fields(n *yaml.Node, v reflect.Value, key string) {
	for i := range v.NumField() {
		if inline(v.Type().Field(i)) {
			r.fields(n, v.Field(i), key)
			continue
		}
		name := yamlName(v.Type().Field(i))
		if name == "" || v.Field(i).Kind() == reflect.Pointer && v.Field(i).IsNil() {
			continue // a nil pointer: the setting's own default holds
		}
		k := join(key, name)
		if secretKey.MatchString(name) && isValue(v.Field(i).Type()) {
			if !v.Field(i).IsZero() {
				r.secrets = append(r.secrets, k)
			}
			continue
		}
		n.Content = append(n.Content, scalar(name), r.node(v.Field(i), k))
	}
}

// scalarOf renders one value, tagged by its kind so that text that reads
// as a number or a boolean is quoted and numbers are not.
func (r *renderer) scalarOf(v reflect.Value, key string) *yaml.Node {
	text := formatValue(v)
	if v.Kind() == reflect.String {
		if t, ok := redactPassword(text); ok {
			text = t
			if !slices.Contains(r.passwords, key) {
				r.passwords = append(r.passwords, key)
			}
		}
	}
	n := scalar(text)
	if v.Type() == durationType {
		return n
	}
	switch v.Kind() {
	case reflect.Bool:
		n.Tag = "!!bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n.Tag = "!!int"
	case reflect.Float32, reflect.Float64:
		n.Tag = "!!float"
	}
	return n
}

// value renders a scalar or a list of scalars, with where it came from.
func (r *renderer) value(v reflect.Value, key string) *yaml.Node {
	var n *yaml.Node
	if v.Kind() == reflect.Slice && v.Type().Elem().Kind() != reflect.Uint8 {
		n = &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
		for i := range v.Len() {
			n.Content = append(n.Content, r.scalarOf(v.Index(i), key))
		}
	} else {
		n = r.scalarOf(v, key)
	}
	n.LineComment = originComment(r.c.Origin(key))
	return n
}

func originComment(origin string) string {
	if origin == "default" {
		return origin
	}
	return "from " + origin
}

// shownDB is the database as logs and messages show it: a PostgreSQL
// URL's or DSN's password is replaced by REDACTED.
func (c Config) shownDB() string {
	s, _ := redactPassword(c.DB)
	return s
}
