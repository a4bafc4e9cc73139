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
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
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
//
// It keeps the balances it has committed in a cache of at most CacheBytes,
// so an account it knows costs no read, reads those it does not hold once
// per batch, all in one key-ordered query (Prepare), and writes each
// account's balance once per batch, when the batch commits
// (Tx.BeforeCommit), in key order.
// That is safe because one server owns the database (outbox.Store.Claim) and
// the processor is its only writer of ledger_balances; or, when servers
// share the database (a consumer group feed), each partition, and so each
// account keyed to it, has one owner at a time, and the cache is dropped
// whenever the store takes a partition (outbox.Store.PartitionClaims):
// another server may have changed its accounts since.
type Processor struct {
	topic string

	mu        sync.Mutex
	committed *balanceCache  // as of the last commit
	tx        *outbox.Tx     // the batch in hand
	pending   *batchBalances // its changes
	scratch   []byte         // the output being built (Emit copies it)
	need      []string       // Prepare's accounts to read
	// lastKeys, lastRead and lastSets are the sizes of the last batch's
	// maps and undo log: the next batch's are made that large, not grown
	// (and rehashed or copied) from empty as its items arrive.
	lastKeys, lastRead, lastSets int
	claims                       int64 // the store's PartitionClaims the cache is as of
}

type balanceKey struct{ feed, account string }

// batchBalances are one transaction's new balances, in first-change order.
type batchBalances struct {
	m     map[balanceKey]*change
	order []changed
	// read holds the committed balances of readFeed's accounts that
	// Prepare found for the batch, in the cache or in SQLite (0 for an
	// account with no row).
	readFeed string
	read     map[string]int64
	readHint int // the size to make read at
	// slab holds the changes m points to, a few thousand an allocation.
	slab []change
	// undo has, for each item applied, what its set changed; undoLast,
	// made once per batch, takes the last one back (an item's rollback
	// comes before any later item), so an item costs no function of its
	// own.
	undo     []undoEntry
	undoLast func()
}

type change struct{ balance, lines int64 }

// changed is an account the batch changed, with its change: the batch's
// write and commit need no lookup of it.
type changed struct {
	k   balanceKey
	c   *change
	pre uint64 // sortChanged's key of the account
}

// undoEntry is what one set changed: k's change before it, or k added.
type undoEntry struct {
	k     balanceKey
	prev  change
	added bool
}

// slabChanges is the number of changes one allocation of a batch holds.
const slabChanges = 4096

var _ ingest.Processor = (*Processor)(nil)

// New returns a ledger processor emitting to topic.
func New(topic string) *Processor {
	c := newBalanceCache(CacheBytes)
	p := &Processor{topic: topic, committed: c}
	// The cache's memory is outside Go's heap: give it back to fastcache's
	// pool once the processor is gone.
	runtime.AddCleanup(p, func(c *balanceCache) { c.reset() }, c)
	return p
}

const (
	selectBalance = `SELECT balance FROM ledger_balances WHERE feed = ? AND account = ?`
)

// Apply adds the line's amount to its account's balance and emits the result.
func (p *Processor) Apply(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
	e, err := Parse(item.Value)
	if err != nil {
		return ingest.Permanent(ingest.ReasonMalformed, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if tx != p.tx {
		p.begin(tx)
	} else {
		p.checkClaims(tx) // a partition taken during the batch: its items come after
	}
	k := balanceKey{d.Feed, e.Account}
	c := p.pending.m[k] // the batch's change of k, nil before its first
	var balance int64
	if c != nil {
		balance = c.balance
	} else if balance, err = p.balance(ctx, tx, k); err != nil {
		return err
	}
	if (e.Amount > 0 && balance > math.MaxInt64-e.Amount) || (e.Amount < 0 && balance < math.MinInt64-e.Amount) {
		return ingest.Malformed("amount %d would overflow the balance %d of %q", e.Amount, balance, e.Account)
	}
	balance += e.Amount
	// Key and value are built in one buffer, reused: Emit copies them.
	buf := append(p.scratch[:0], e.Account...)
	buf = appendOutput(buf, Output{Account: e.Account, Amount: e.Amount, Balance: balance,
		Feed: d.Feed, Epoch: d.Epoch, Position: d.Position})
	p.scratch = buf
	key, v := buf[:len(e.Account)], buf[len(e.Account):]
	if err := tx.Emit(ctx, outbox.Output{Topic: p.topic, Key: key, Value: v}); err != nil {
		return err
	}
	p.pending.set(k, c, balance)
	tx.OnRollbackItem(p.pending.undoLast)
	return nil
}

// begin starts tracking a new transaction: what an earlier one left pending
// never committed, so it is dropped.
func (p *Processor) begin(tx *outbox.Tx) {
	p.checkClaims(tx)
	b := &batchBalances{m: make(map[balanceKey]*change, p.lastKeys), readHint: p.lastRead,
		order: make([]changed, 0, p.lastKeys), undo: make([]undoEntry, 0, p.lastSets)}
	b.undoLast = b.takeBackLast
	p.tx, p.pending = tx, b
	tx.BeforeCommit(func(ctx context.Context) error { return b.write(ctx, tx) })
	tx.OnCommit(func() { p.commit(b) })
}

// checkClaims drops the committed balances when the store took a
// partition since they were cached (see Processor). p.mu is held.
func (p *Processor) checkClaims(tx *outbox.Tx) {
	if n := tx.Store().PartitionClaims(); n != p.claims {
		p.committed.reset()
		p.claims = n
	}
}

// set records k's new balance, and what it changed for takeBackLast; c
// is k's change in the batch, nil if it has none yet.
func (b *batchBalances) set(k balanceKey, c *change, balance int64) {
	if c == nil {
		if len(b.slab) == cap(b.slab) {
			b.slab = make([]change, 0, slabChanges)
		}
		b.slab = append(b.slab, change{balance: balance, lines: 1})
		c = &b.slab[len(b.slab)-1]
		b.m[k] = c
		b.order = append(b.order, changed{k: k, c: c})
		b.undo = append(b.undo, undoEntry{k: k, added: true})
		return
	}
	b.undo = append(b.undo, undoEntry{k: k, prev: *c})
	c.balance = balance
	c.lines++
}

// takeBackLast undoes the last set: that of the item being rolled back.
func (b *batchBalances) takeBackLast() {
	u := b.undo[len(b.undo)-1]
	b.undo = b.undo[:len(b.undo)-1]
	if u.added {
		delete(b.m, u.k)
		b.order = b.order[:len(b.order)-1] // k was added last: later items came after this one
		return
	}
	*b.m[u.k] = u.prev
}

// write stores the batch's balances in statements of outbox.ChunkSize
// accounts; a chunk of one feed binds the feed once. They are written in
// key order: consecutive upserts then land on the same B-tree pages, which
// at a large state halves the work of a batch (pages stay in the CPU's
// caches and each is found once). No item of the batch is undone after
// this, so the order the undo functions rely on is no longer needed. The
// statements run on the driver's connection, with driver arguments, as
// the store writes the outbox.
func (b *batchBalances) write(ctx context.Context, tx *outbox.Tx) error {
	if len(b.order) == 0 {
		return nil
	}
	sortChanged(b.order)
	return tx.Batch(func(bt *outbox.Batch) error {
		args := make([]any, 0, min(len(b.order), upsertChunk)*4)
		for keys := b.order; len(keys) > 0; {
			k := outbox.ChunkSize(len(keys), upsertChunk)
			if err := upsert(ctx, bt, keys[:k], args[:0]); err != nil {
				return err
			}
			keys = keys[k:]
		}
		return nil
	})
}

// upsert writes one chunk of balances, building its arguments in args.
func upsert(ctx context.Context, bt *outbox.Batch, chunk []changed, args []any) error {
	st := upsertStmts[len(chunk)]
	if oneFeed(chunk) {
		st = upsertOneFeedStmts[len(chunk)]
		args = append(args, chunk[0].k.feed)
		for _, e := range chunk {
			args = append(args, e.k.account, e.c.balance, e.c.lines)
		}
	} else {
		for _, e := range chunk {
			args = append(args, e.k.feed, e.k.account, e.c.balance, e.c.lines)
		}
	}
	if err := bt.Exec(ctx, st, args...); err != nil {
		return fmt.Errorf("store balances: %w", err)
	}
	return nil
}

// compareKeys orders keys as ledger_balances' primary key does: by feed,
// then account, bytewise (SQLite's BINARY collation).
func compareKeys(a, b balanceKey) int {
	if c := strings.Compare(a.feed, b.feed); c != 0 {
		return c
	}
	return strings.Compare(a.account, b.account)
}

// sortChanged sorts order as ledger_balances' primary key. When one feed
// changed them all (the common case) it sorts by account alone, and first
// by the eight bytes that follow the prefix every account shares, as a
// big-endian integer padded with zeros: that orders as the bytes do, and
// most pairs differ there, so they cost one integer comparison, not a
// comparison of strings. Pairs equal there are compared whole.
func sortChanged(order []changed) {
	if len(order) == 0 || !oneFeed(order) {
		slices.SortFunc(order, func(a, b changed) int { return compareKeys(a.k, b.k) })
		return
	}
	shared := sharedPrefix(order)
	for i := range order {
		order[i].pre = prefixKey(order[i].k.account[shared:])
	}
	slices.SortFunc(order, func(a, b changed) int {
		if c := cmp.Compare(a.pre, b.pre); c != 0 {
			return c
		}
		return strings.Compare(a.k.account, b.k.account)
	})
}

// sharedPrefix is the length of the prefix all of order's accounts share.
func sharedPrefix(order []changed) int {
	first := order[0].k.account
	n := len(first)
	for _, e := range order[1:] {
		a := e.k.account
		n = min(n, len(a))
		for i := 0; i < n; i++ {
			if a[i] != first[i] {
				n = i
				break
			}
		}
	}
	return n
}

// prefixKey is s's first eight bytes as a big-endian integer, padded with
// zeros: a shorter key never orders after a longer one it begins, and
// strings equal in the key are left to a whole comparison.
func prefixKey(s string) uint64 {
	var k uint64
	for i := range 8 {
		k <<= 8
		if i < len(s) {
			k |= uint64(s[i])
		}
	}
	return k
}

func oneFeed(keys []changed) bool {
	for _, e := range keys[1:] {
		if e.k.feed != keys[0].k.feed {
			return false
		}
	}
	return true
}

// upsertChunk is the most balances one statement writes.
const upsertChunk = 64

// The upserts by number of balances (upsertChunk and the powers of two
// below it): binding every column, or the feed once for all.
var upsertBySize, upsertOneFeedBySize = map[int]string{}, map[int]string{}

// upsertStmts and upsertOneFeedStmts are those upserts, declared to the
// store.
var upsertStmts, upsertOneFeedStmts = map[int]*outbox.Statement{}, map[int]*outbox.Statement{}

// pgOnConflict is the upserts' conflict clause on PostgreSQL, which names
// the existing row by its table.
const pgOnConflict = " ON CONFLICT(feed, account) DO UPDATE SET balance = excluded.balance, lines = ledger_balances.lines + excluded.lines"

// typedPlaceholders is outbox.Placeholders with each column's value cast
// to its type: PostgreSQL types a parameter of a VALUES list as text
// unless told.
func typedPlaceholders(n int, types ...string) string {
	g := make([]string, len(types))
	for i, t := range types {
		g[i] = "?::" + t
	}
	group := "(" + strings.Join(g, ",") + ")"
	return strings.TrimSuffix(strings.Repeat(group+",", n), ",")
}

func init() {
	const onConflict = " ON CONFLICT(feed, account) DO UPDATE SET balance = excluded.balance, lines = lines + excluded.lines"
	for n := upsertChunk; n >= 1; n /= 2 {
		upsertBySize[n] = "INSERT INTO ledger_balances (feed, account, balance, lines) VALUES " +
			outbox.Placeholders(n, 4) + onConflict
		// "WHERE true" tells SQLite's parser the ON starts the upsert, not
		// a join constraint.
		upsertOneFeedBySize[n] = "INSERT INTO ledger_balances (feed, account, balance, lines) " +
			"SELECT ?, column1, column2, column3 FROM (VALUES " + outbox.Placeholders(n, 3) + ") WHERE true" + onConflict
		upsertStmts[n] = outbox.NewStatement(upsertBySize[n]).OnPostgres(
			"INSERT INTO ledger_balances (feed, account, balance, lines) VALUES " +
				typedPlaceholders(n, "text", "text", "bigint", "bigint") + pgOnConflict)
		upsertOneFeedStmts[n] = outbox.NewStatement(upsertOneFeedBySize[n]).OnPostgres(
			"INSERT INTO ledger_balances (feed, account, balance, lines) " +
				"SELECT ?::text, v.column1, v.column2, v.column3 FROM (VALUES " + typedPlaceholders(n, "text", "bigint", "bigint") +
				") AS v(column1, column2, column3)" + pgOnConflict)
	}
}

// UpsertSQL is the statement the processor stores n balances of one feed
// with: the feed bound once, then account, balance and lines for each. n is
// a chunk size (outbox.ChunkSize with at most UpsertChunk).
func UpsertSQL(n int) string { return upsertOneFeedBySize[n] }

// UpsertChunk is the most balances one UpsertSQL statement stores.
const UpsertChunk = upsertChunk

// commit makes a committed batch's balances the known ones.
func (p *Processor) commit(b *batchBalances) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastKeys, p.lastRead, p.lastSets = len(b.m), len(b.read), len(b.undo)
	for _, e := range b.order {
		p.committed.set(e.k, e.c.balance)
	}
}

// balance is the balance of an account the batch has not changed yet: as
// Prepare read it, as committed, or as SQLite holds it.
func (p *Processor) balance(ctx context.Context, tx *outbox.Tx, k balanceKey) (int64, error) {
	if k.feed == p.pending.readFeed {
		if b, ok := p.pending.read[k.account]; ok {
			return b, nil
		}
	}
	if b, ok := p.committed.get(k); ok {
		return b, nil
	}
	sel, err := tx.ReadStmt(ctx, selectBalance)
	if err != nil {
		return 0, err
	}
	var b int64
	err = sel.QueryRowxContext(ctx, k.feed, k.account).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read balance of %q: %w", k.account, err)
	}
	return b, nil
}

// appendOutput appends o as JSON, byte for byte what encoding/json makes
// of it, without reflection.
func appendOutput(b []byte, o Output) []byte {
	b = append(b, `{"account":`...)
	b = appendString(b, o.Account)
	b = append(b, `,"amount":`...)
	b = strconv.AppendInt(b, o.Amount, 10)
	b = append(b, `,"balance":`...)
	b = strconv.AppendInt(b, o.Balance, 10)
	b = append(b, `,"feed":`...)
	b = appendString(b, o.Feed)
	b = append(b, `,"epoch":`...)
	b = appendString(b, o.Epoch)
	b = append(b, `,"position":`...)
	b = strconv.AppendInt(b, o.Position, 10)
	return append(b, '}')
}

// appendString appends s as a JSON string: plainly when it holds only
// printable ASCII that encoding/json leaves alone, through encoding/json
// otherwise.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// Balances returns every account's balance of a feed.
func Balances(ctx context.Context, s *outbox.Store, feed string) (map[string]int64, error) {
	var rows []struct {
		Account string `db:"account"`
		Balance int64  `db:"balance"`
	}
	err := s.View(ctx, func(r *outbox.ReadTx) error {
		return r.Select(ctx, &rows, `SELECT account, balance FROM ledger_balances WHERE feed = ?`, feed)
	})
	if err != nil {
		return nil, fmt.Errorf("read balances of %s: %w", feed, err)
	}
	m := make(map[string]int64, len(rows))
	for _, r := range rows {
		m[r.Account] = r.Balance
	}
	return m, nil
}
