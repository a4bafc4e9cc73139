package sqlproc

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Input kinds.
const (
	InputCSV  = "csv"  // one record of delimited fields, named by Columns
	InputJSON = "json" // a JSON document, fields picked by path (Fields)
	InputRaw  = "raw"  // nothing decoded: the statements read :value and :key
)

// CSV quoting styles.
const (
	QuotingRFC4180 = "rfc4180" // "a ""quoted"" field", as RFC 4180 (the default)
	QuotingNone    = "none"    // quotes are ordinary characters; fields never hold the delimiter
)

// Kind is the processor kind a configuration names to get a SQL processor.
const Kind = "sql"

// Config declares a SQL processor. Its fields map one to one to an entry
// of the configuration file's "processors" section.
type Config struct {
	// Name names the processor in errors and logs (the key of its entry).
	Name string `yaml:"-"`
	// Kind is Kind or empty.
	Kind string `yaml:"kind,omitempty" usage:"the processor's kind: sql"`
	// Input is InputCSV, InputJSON or InputRaw.
	Input string `yaml:"input" usage:"how an item is decoded: csv (named columns), json (named paths) or raw (nothing: the statements read :value)"`

	// Columns names a CSV record's fields, in order: a record with another
	// number of fields is malformed. Each becomes the parameter :name.
	Columns []string `yaml:"columns,omitempty" usage:"csv: the fields' names, in order, each a parameter :NAME; a record with another number of fields is malformed"`
	// Delimiter separates CSV fields: one character, "," unless set.
	Delimiter string `yaml:"delimiter,omitempty" usage:"csv: the field delimiter, one ASCII character (\\t for a tab; default ,)"`
	// Quoting is QuotingRFC4180 (the default) or QuotingNone.
	Quoting string `yaml:"quoting,omitempty" usage:"csv: rfc4180 (the default: \"quoted, fields\") or none (quotes are ordinary characters)"`
	// Trim drops Unicode white space around each CSV field.
	Trim bool `yaml:"trim,omitempty" usage:"csv: drop Unicode white space around each field"`
	// Text names the CSV columns bound as TEXT whatever they hold, so that
	// an account "007" stays "007" (others that are integers bind as
	// INTEGER).
	Text []string `yaml:"text,omitempty" usage:"csv: the columns bound as TEXT even when they read as integers (an account 007)"`

	// Fields names values of a JSON document by path: "$.a.b[0]", "a.b"
	// (the same), `$["odd key"]`. Each becomes the parameter :name.
	Fields map[string]string `yaml:"fields,omitempty" usage:"json: NAME: PATH pairs ($.a.b[0]), each a parameter :NAME; a missing path binds NULL"`
	// Required lists the Fields whose absence makes a document malformed
	// (JSON null is present); a missing field that is not required is NULL.
	Required []string `yaml:"required,omitempty" usage:"json: the fields whose absence makes a document malformed"`

	// Topic is the outputs' topic when the emit statement has no "topic"
	// column, or a row's topic is NULL.
	Topic string `yaml:"topic,omitempty" usage:"the outputs' topic when emit has no topic column or gives NULL (default: the feed's topic)"`

	// Setup runs when the processor starts, in its own transaction: any
	// number of statements (CREATE TABLE IF NOT EXISTS ...). It takes no
	// parameters.
	Setup string `yaml:"setup,omitempty" usage:"statements run at start, in their own transaction (CREATE TABLE IF NOT EXISTS ...); no parameters"`
	// Migrations change the tables setup made, each once, in the order of
	// their versions, after setup, in the transaction that records it (see
	// Migration).
	Migrations []Migration `yaml:"migrations,omitempty" usage:"a list of {version: N, sql: ...}: each runs once, in order, after setup, in the transaction that records its version"`
	// Reads names what the processor may read of other feeds' processors:
	// "FEED" (every table its setup and migrations make) or "FEED.TABLE".
	// It never writes them. The configuration resolves each into ReadFrom.
	Reads []string `yaml:"reads,omitempty" usage:"other feeds' tables the statements may read, never write: FEED (all its processor's tables) or FEED.TABLE"`
	// ReadFrom are the processors Reads names, resolved by the
	// configuration (see ReadSource).
	ReadFrom []ReadSource `yaml:"-"`

	// Window makes the processor aggregate in windows of event time (see
	// Window): apply runs per open window of the item, emit once per
	// window when the watermark passes its end.
	// The zero Window is none.
	Window Window `yaml:"window,omitempty"`

	// Reject is one query run first for each item: a row returned makes
	// the item a dead letter, its first column the reason, its second (if
	// any) the error.
	Reject string `yaml:"reject,omitempty" usage:"one query run first per item: a row makes the item a dead letter (reason, then optionally the error)"`
	// Apply holds the statements that change the state, run in order.
	Apply string `yaml:"apply,omitempty" usage:"the statements that change the state, run in order in the item's savepoint"`
	// Emit is one query (a SELECT, or a statement with RETURNING) run last:
	// each row is an output, from its columns topic, key, value and headers.
	Emit string `yaml:"emit,omitempty" usage:"one query run last: each row is an output, columns topic, key, value and optionally headers"`
}

// Windowed reports whether c declares a window.
func (c Config) Windowed() bool { return c.Window != (Window{}) }

// Parameters every statement may use, bound from the item's Delivery.
const (
	ParamFeed      = "feed"
	ParamPartition = "partition"
	ParamTopic     = "topic"
	ParamEpoch     = "epoch"
	ParamPosition  = "position"
	ParamSequence  = "sequence"
	ParamAttempt   = "attempt"
	ParamKey       = "key"
	ParamValue     = "value"
	ParamHeaders   = "headers"
)

// deliveryParams are the parameters of every processor, in the order of
// their slots in a bound item.
var deliveryParams = []string{ParamFeed, ParamPartition, ParamTopic, ParamEpoch, ParamPosition,
	ParamSequence, ParamAttempt, ParamKey, ParamValue, ParamHeaders}

// Output columns of the emit statement.
const (
	ColTopic   = "topic"
	ColKey     = "key"
	ColValue   = "value"
	ColHeaders = "headers"
)

// maxSQL bounds each statement field: configuration, not data.
const maxSQL = 1 << 20

// Validate checks what can be checked without a database: the input's
// description, the statements' syntax as far as splitting them goes, and
// their parameters. The error is one line naming the processor and, for a
// statement, which one. Check goes on to compile the statements.
func (c Config) Validate() error {
	_, err := c.compile()
	return err
}

// plan is a configuration checked and cut into statements.
type plan struct {
	cfg    Config
	params []string // every parameter: deliveryParams, then the decoded ones
	setup  []statement
	migs   []migration
	reads  []readPlan
	window *windowPlan
	reject *statement
	apply  []statement
	emit   *statement
}

func (c Config) compile() (*plan, error) {
	if err := c.validateName(); err != nil {
		return nil, err
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("sqlproc %s: %s", c.Name, fmt.Sprintf(format, args...))
	}
	if c.Kind != "" && c.Kind != Kind {
		return nil, fail("kind %q is not %q", c.Kind, Kind)
	}
	decoded, err := c.decodedNames()
	if err != nil {
		return nil, fail("%v", err)
	}
	p := &plan{cfg: c, params: append(slices.Clip(deliveryParams), decoded...)}
	itemParams, emitParams := p.params, p.params
	if c.Windowed() {
		p.params = append(slices.Clip(p.params), ParamWindowStart, ParamWindowEnd)
		emitParams = []string{ParamWindowStart, ParamWindowEnd}
		if p.window, err = c.windowPlan(p, itemParams); err != nil {
			return nil, err
		}
	}
	if p.setup, err = c.statements("setup", c.Setup, nil); err != nil {
		return nil, err
	}
	if p.migs, err = c.migrations(); err != nil {
		return nil, err
	}
	if p.reads, err = c.readPlans(); err != nil {
		return nil, err
	}
	if p.apply, err = c.statements("apply", c.Apply, p.params); err != nil {
		return nil, err
	}
	if p.reject, err = c.single("reject", c.Reject, itemParams); err != nil {
		return nil, err
	}
	if p.emit, err = c.single("emit", c.Emit, emitParams); err != nil {
		return nil, err
	}
	if p.window != nil && len(p.apply) == 0 {
		return nil, fail("window: apply holds no statement: nothing would count in the windows")
	}
	if len(p.apply) == 0 && p.emit == nil {
		return nil, fail("neither apply nor emit holds a statement: the processor would do nothing")
	}
	if strings.ContainsAny(c.Topic, "\x00\n") || !utf8.ValidString(c.Topic) {
		return nil, fail("topic %q is not a topic name", c.Topic)
	}
	return p, nil
}

func (c Config) validateName() error {
	if c.Name == "" {
		return errors.New("sqlproc: a processor needs a name")
	}
	if !utf8.ValidString(c.Name) || strings.ContainsAny(c.Name, "\x00\n\r") {
		return fmt.Errorf("sqlproc %q: the name is not one line of text", c.Name)
	}
	return nil
}

// decodedNames checks the input's description and returns the parameters
// it decodes, in order.
func (c Config) decodedNames() ([]string, error) {
	switch c.Input {
	case InputCSV:
		return c.csvNames()
	case InputJSON:
		return c.jsonNames()
	case InputRaw:
		if len(c.Columns) > 0 || len(c.Fields) > 0 || len(c.Required) > 0 || len(c.Text) > 0 {
			return nil, errors.New("input raw decodes nothing: columns, text, fields and required do not apply")
		}
		return nil, nil
	case "":
		return nil, errors.New("input: missing, want one of csv, json, raw")
	}
	return nil, fmt.Errorf("input: %q is not one of csv, json, raw", c.Input)
}

func (c Config) csvNames() ([]string, error) {
	if len(c.Fields) > 0 || len(c.Required) > 0 {
		return nil, errors.New("input csv: fields and required are for json input (csv has columns)")
	}
	if len(c.Columns) == 0 {
		return nil, errors.New("input csv: columns: none named")
	}
	if _, err := c.delimiter(); err != nil {
		return nil, err
	}
	switch c.Quoting {
	case "", QuotingRFC4180, QuotingNone:
	default:
		return nil, fmt.Errorf("quoting: %q is not one of rfc4180, none", c.Quoting)
	}
	if err := checkNames("column", c.Columns); err != nil {
		return nil, err
	}
	for _, n := range c.Text {
		if !slices.Contains(c.Columns, n) {
			return nil, fmt.Errorf("text: %q is not one of the columns", n)
		}
	}
	return slices.Clone(c.Columns), nil
}

// delimiter is the CSV delimiter: one character that cannot be part of a
// field's syntax.
func (c Config) delimiter() (byte, error) {
	d := c.Delimiter
	if d == "" {
		return ',', nil
	}
	if d == `\t` {
		d = "\t"
	}
	if len(d) != 1 || d[0] >= 0x80 || d[0] == '"' || d[0] == '\r' || d[0] == '\n' {
		return 0, fmt.Errorf("delimiter: %q is not one ASCII character other than a quote or a line break", c.Delimiter)
	}
	return d[0], nil
}

func (c Config) jsonNames() ([]string, error) {
	if len(c.Columns) > 0 || c.Delimiter != "" || c.Quoting != "" || c.Trim || len(c.Text) > 0 {
		return nil, errors.New("input json: columns, delimiter, quoting, trim and text are for csv input (json has fields)")
	}
	if len(c.Fields) == 0 {
		return nil, errors.New("input json: fields: none named")
	}
	names := make([]string, 0, len(c.Fields))
	for name := range c.Fields {
		names = append(names, name)
	}
	slices.Sort(names)
	if err := checkNames("field", names); err != nil {
		return nil, err
	}
	for _, name := range names {
		if _, err := parsePath(c.Fields[name]); err != nil {
			return nil, fmt.Errorf("field %s: path %q: %v", name, c.Fields[name], err)
		}
	}
	for _, r := range c.Required {
		if _, ok := c.Fields[r]; !ok {
			return nil, fmt.Errorf("required: %q is not one of the fields", r)
		}
	}
	return names, nil
}

// checkNames refuses names that are not parameter names, repeat, or take
// the name of a Delivery parameter.
func checkNames(what string, names []string) error {
	seen := map[string]bool{}
	for _, n := range names {
		if !isParamName(n) {
			return fmt.Errorf("%s %q: a name is a letter, then letters, digits or _", what, n)
		}
		if slices.Contains(deliveryParams, n) {
			return fmt.Errorf("%s %q: the name is taken by the delivery's parameter :%s", what, n, n)
		}
		if seen[n] {
			return fmt.Errorf("%s %q: named twice", what, n)
		}
		seen[n] = true
	}
	return nil
}

func isParamName(n string) bool {
	if n == "" || !(n[0] >= 'a' && n[0] <= 'z' || n[0] >= 'A' && n[0] <= 'Z') {
		return false
	}
	for i := 1; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// statements splits one of the SQL fields and checks its statements'
// parameters against known (nil: none allowed).
func (c Config) statements(field, src string, known []string) ([]statement, error) {
	if len(src) > maxSQL {
		return nil, fmt.Errorf("sqlproc %s: %s: %d bytes of SQL, more than %d", c.Name, field, len(src), maxSQL)
	}
	stmts, err := split(src)
	if err != nil {
		return nil, fmt.Errorf("sqlproc %s: %s: %v", c.Name, field, err)
	}
	for i, s := range stmts {
		if err := checkStatement(s, known); err != nil {
			return nil, fmt.Errorf("sqlproc %s: %s: %v", c.Name, stmtName(field, i, len(stmts), s.text), err)
		}
	}
	return stmts, nil
}

// single is the one statement of reject or emit, nil when there is none.
func (c Config) single(field, src string, known []string) (*statement, error) {
	stmts, err := c.statements(field, src, known)
	if err != nil || len(stmts) == 0 {
		return nil, err
	}
	if len(stmts) > 1 {
		return nil, fmt.Errorf("sqlproc %s: %s: %d statements, want one (its rows are the %s)",
			c.Name, field, len(stmts), map[string]string{"reject": "reasons", "emit": "outputs"}[field])
	}
	return &stmts[0], nil
}

func checkStatement(s statement, known []string) error {
	if strings.HasPrefix(s.refused, "?") {
		return fmt.Errorf("positional parameter %s: name parameters (:name)", s.refused)
	}
	if s.refused != "" {
		return fmt.Errorf("%s: a conflict resolution or RAISE that rolls back would end outboxd's transaction, not the statement's; use ABORT", s.refused)
	}
	for _, p := range s.params {
		if !slices.Contains(known, p) {
			if known == nil {
				return fmt.Errorf("parameter :%s: setup statements take no parameters", p)
			}
			return fmt.Errorf("unknown parameter :%s (known: :%s)", p, strings.Join(known, ", :"))
		}
	}
	return nil
}

// stmtName names a statement in an error: "apply statement 2 (INSERT INTO
// balances ...)", or just "emit (SELECT ...)" for a field's only statement.
func stmtName(field string, i, n int, text string) string {
	name := field
	if n > 1 {
		name = fmt.Sprintf("%s statement %d", field, i+1)
	}
	return name + " (" + excerpt(text) + ")"
}

// excerpt is the start of a statement on one line.
func excerpt(text string) string {
	const max = 48
	s := strings.Join(strings.Fields(text), " ")
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.TrimRight(s[:cut], " ") + " ..."
}
