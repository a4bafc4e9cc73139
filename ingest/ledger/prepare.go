package ledger

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

var _ ingest.Preparer = (*Processor)(nil)

// readChunk is the most balances one statement of Prepare reads.
const readChunk = 256

// readBySize are the batch reads by number of accounts (readChunk and the
// powers of two below it).
var readBySize = map[int]string{}

// readStmts are those reads, declared to the store.
var readStmts = map[int]*outbox.Statement{}

func init() {
	for n := readChunk; n >= 1; n /= 2 {
		readBySize[n] = "SELECT account, balance FROM ledger_balances WHERE feed = ? AND account IN (" +
			strings.Repeat("?,", n-1) + "?)"
		readStmts[n] = outbox.NewStatement(readBySize[n])
	}
}

// ReadSQL is the statement Prepare reads n balances of one feed with: the
// feed, then n accounts. n is a chunk size (outbox.ChunkSize with at most
// ReadChunk).
func ReadSQL(n int) string { return readBySize[n] }

// ReadChunk is the most accounts one ReadSQL statement takes.
const ReadChunk = readChunk

// Prepare reads, in key order and a few statements, the committed balance
// of every account of items that the processor holds neither in its cache
// nor in the batch: at a state larger than the cache, a freshly started
// server would otherwise read each of them alone, one statement per
// account. An account that has no row has balance 0. Lines that do not
// parse are left to Apply, which dead-letters them.
func (p *Processor) Prepare(ctx context.Context, tx *outbox.Tx, feed string, items []ingest.Item) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if tx != p.tx {
		p.begin(tx)
	} else {
		p.checkClaims(tx) // a partition taken during the batch: its items come after
	}
	b := p.pending
	if b.readFeed != feed {
		b.readFeed, b.read = feed, make(map[string]int64, b.readHint)
	}
	need := p.need[:0]
	for _, it := range items {
		// An account is copied once per batch, at its first item.
		acct, ok := account(it.Value)
		if !ok {
			continue
		}
		if _, ok := b.read[string(acct)]; ok {
			continue
		}
		if len(b.m) > 0 { // changed by an item already: its balance is known
			if _, ok := b.m[balanceKey{feed, string(acct)}]; ok {
				continue
			}
		}
		a := string(acct)
		if v, ok := p.committed.lookup(feed, acct); ok {
			// Kept with the batch's reads, the account is looked up
			// neither in the cache again by Apply nor by the next item of it.
			b.read[a] = v
			continue
		}
		b.read[a] = 0
		need = append(need, a)
	}
	p.need = need[:0]
	defer clear(need)
	// Key order: each B-tree page is found once, and the batch's upserts
	// find the same pages in SQLite's cache.
	slices.Sort(need)
	if err := b.readBalances(ctx, tx, feed, need); err != nil {
		// Half read, the zeros set above would stand for balances: forget
		// every read, so each account is read on its own again.
		b.readFeed, b.read = "", nil
		return err
	}
	return nil
}

// account is the account of a line as Parse finds it, when the line has
// one; the amount is left to Parse (a line with a bad one only costs its
// account a read).
func account(line []byte) ([]byte, bool) {
	acct, _, ok := bytes.Cut(line, []byte{','})
	if !ok {
		return nil, false
	}
	acct = bytes.TrimSpace(acct)
	return acct, len(acct) > 0 && utf8.Valid(acct)
}

// readBalances reads the balances of accounts of feed into b.read, in
// statements of at most readChunk accounts, declared to the store (Batch):
// through database/sql, converting each argument and scanning each row
// again cost about a fifth of the reads (see BenchmarkBatchRead).
func (b *batchBalances) readBalances(ctx context.Context, tx *outbox.Tx, feed string, accounts []string) error {
	if len(accounts) == 0 {
		return nil
	}
	return tx.Batch(func(bt *outbox.Batch) error {
		args := make([]any, 0, 1+min(len(accounts), readChunk))
		for len(accounts) > 0 {
			k := outbox.ChunkSize(len(accounts), readChunk)
			args = append(args[:0], feed)
			for _, a := range accounts[:k] {
				args = append(args, a)
			}
			if err := b.readChunk(ctx, bt, k, args); err != nil {
				return err
			}
			accounts = accounts[k:]
		}
		return nil
	})
}

// readChunk runs the read of k accounts with args.
func (b *batchBalances) readChunk(ctx context.Context, bt *outbox.Batch, k int, args []any) error {
	rows, err := bt.Query(ctx, readStmts[k], args...)
	if err != nil {
		return fmt.Errorf("read balances: %w", err)
	}
	defer rows.Close()
	for {
		switch ok, err := rows.Next(); {
		case err != nil:
			return fmt.Errorf("read balances: %w", err)
		case !ok:
			return nil
		}
		row := rows.Values()
		// The table is STRICT: a row holds a TEXT account and an INTEGER
		// balance, or the database is damaged.
		account, aok := row[0].(string)
		balance, bok := row[1].(int64)
		if !aok || !bok {
			return fmt.Errorf("read balances: a row of %T, %T, want TEXT, INTEGER", row[0], row[1])
		}
		b.read[account] = balance
	}
}
