// Package ledger is the built-in processor for lines "account,amount": it
// keeps a balance per account, and emits one output per line with the
// account's new balance.
//
// Every balance changes exactly once per line, however often the line is
// delivered: the ingest loop's guard and the transaction it runs Apply in
// see to that. A line that is not "account,amount" with a non-empty account
// and a signed 64-bit amount, or whose amount would overflow the balance, is
// a dead letter with reason "malformed".
package ledger

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Name is the processor's name on the command line.
const Name = "ledger"

// Entry is one decoded line.
type Entry struct {
	Account string
	Amount  int64
}

// Parse decodes a line "account,amount". Spaces around either field are
// ignored; the amount is a base-10 signed 64-bit integer ("+" allowed).
func Parse(line []byte) (Entry, error) {
	acct, amt, ok := bytes.Cut(line, []byte{','})
	if !ok {
		return Entry{}, errors.New("no comma: want account,amount")
	}
	acct, amt = bytes.TrimSpace(acct), bytes.TrimSpace(amt)
	if len(acct) == 0 {
		return Entry{}, errors.New("empty account")
	}
	if !utf8.Valid(acct) {
		return Entry{}, errors.New("account is not UTF-8")
	}
	if len(amt) == 0 {
		return Entry{}, errors.New("missing amount")
	}
	n, err := strconv.ParseInt(string(amt), 10, 64)
	if err != nil {
		return Entry{}, fmt.Errorf("amount %q is not a 64-bit integer", amt)
	}
	return Entry{Account: string(acct), Amount: n}, nil
}

// Output is the JSON value of each output record.
type Output struct {
	Account  string `json:"account"`
	Amount   int64  `json:"amount"`
	Balance  int64  `json:"balance"`
	Feed     string `json:"feed"`
	Epoch    string `json:"epoch"`
	Position int64  `json:"position"`
}

// Processor is the ledger processor. It is safe for use by several feeds:
// balances are kept per feed.
type Processor struct {
	topic string
}

var _ ingest.Processor = (*Processor)(nil)

// New returns a ledger processor emitting to topic.
func New(topic string) *Processor { return &Processor{topic: topic} }

const (
	selectBalance = `SELECT balance FROM ledger_balances WHERE feed = ? AND account = ?`
	upsertBalance = `INSERT INTO ledger_balances (feed, account, balance, lines) VALUES (?, ?, ?, 1)
ON CONFLICT(feed, account) DO UPDATE SET balance = excluded.balance, lines = lines + 1`
)

// Apply adds the line's amount to its account's balance and emits the result.
func (p *Processor) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	e, err := Parse(item.Value)
	if err != nil {
		return ingest.Permanent(ingest.ReasonMalformed, err)
	}
	balance, err := p.balance(ctx, tx, d.Feed, e.Account)
	if err != nil {
		return err
	}
	if (e.Amount > 0 && balance > math.MaxInt64-e.Amount) || (e.Amount < 0 && balance < math.MinInt64-e.Amount) {
		return ingest.Malformed("amount %d would overflow the balance %d of %q", e.Amount, balance, e.Account)
	}
	balance += e.Amount
	up, err := tx.Stmt(ctx, upsertBalance)
	if err != nil {
		return err
	}
	if _, err := up.ExecContext(ctx, d.Feed, e.Account, balance); err != nil {
		return fmt.Errorf("store balance of %q: %w", e.Account, err)
	}
	v, err := json.Marshal(Output{Account: e.Account, Amount: e.Amount, Balance: balance, Feed: d.Feed, Epoch: d.Epoch, Position: d.Position})
	if err != nil {
		return fmt.Errorf("encode output: %w", err)
	}
	return tx.Emit(ctx, outbox.Output{Topic: p.topic, Key: []byte(e.Account), Value: v})
}

func (p *Processor) balance(ctx context.Context, tx *outbox.Tx, feed, account string) (int64, error) {
	sel, err := tx.Stmt(ctx, selectBalance)
	if err != nil {
		return 0, err
	}
	var b int64
	err = sel.QueryRowxContext(ctx, feed, account).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read balance of %q: %w", account, err)
	}
	return b, nil
}

// Balances returns every account's balance of a feed.
func Balances(ctx context.Context, s *outbox.Store, feed string) (map[string]int64, error) {
	var rows []struct {
		Account string `db:"account"`
		Balance int64  `db:"balance"`
	}
	if err := s.ReadDB().SelectContext(ctx, &rows, `SELECT account, balance FROM ledger_balances WHERE feed = ?`, feed); err != nil {
		return nil, fmt.Errorf("read balances of %s: %w", feed, err)
	}
	m := make(map[string]int64, len(rows))
	for _, r := range rows {
		m[r.Account] = r.Balance
	}
	return m, nil
}
