package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
)

// benchLine is one generated ledger line.
type benchLine struct {
	Index    int64 // 0-based
	Account  int   // index into the account names
	Amount   int64
	Position int64 // the byte offset after the line: the file feed's position of it
}

// ledgerGen yields the bench's ledger lines "acct-N,AMOUNT" in order. They
// are a pure function of the line index, so every phase and the verifier
// regenerate them instead of keeping them in memory.
type ledgerGen struct {
	names []string
	i     int64
	pos   int64
	buf   []byte
}

// newLedgerGen starts at the first line.
func newLedgerGen(names []string) *ledgerGen {
	return &ledgerGen{names: names, buf: make([]byte, 0, 64)}
}

// next returns the next line and its text, "\n" included. The text is
// valid until the following call.
func (g *ledgerGen) next() (benchLine, []byte) {
	h := mix64(uint64(g.i))
	l := benchLine{Index: g.i, Account: int(h % uint64(len(g.names))), Amount: int64((h>>32)%2001) - 1000}
	g.buf = append(g.buf[:0], g.names[l.Account]...)
	g.buf = append(g.buf, ',')
	g.buf = strconv.AppendInt(g.buf, l.Amount, 10)
	g.buf = append(g.buf, '\n')
	g.pos += int64(len(g.buf))
	g.i++
	l.Position = g.pos
	return l, g.buf
}

// mix64 is SplitMix64's finalizer: well-spread accounts and amounts from a
// counter, the same on every run.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// accountNames are the accounts "acct-0" ... "acct-<n-1>".
func accountNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = "acct-" + strconv.Itoa(i)
	}
	return names
}

// ledgerData describes the generated ledger file and what applying it must
// give.
type ledgerData struct {
	Path  string
	Lines int64
	Size  int64
	Names []string
	// Sums and Counts are each account's expected balance and line count.
	Sums   []int64
	Counts []int64
}

// writeLedger writes lines generated lines to path, streaming, and returns
// what they hold.
func writeLedger(ctx context.Context, path string, lines int64, accounts int) (ledgerData, error) {
	d := ledgerData{Path: path, Lines: lines, Names: accountNames(accounts),
		Sums: make([]int64, accounts), Counts: make([]int64, accounts)}
	f, err := os.Create(path)
	if err != nil {
		return d, fmt.Errorf("create ledger file: %w", err)
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	g := newLedgerGen(d.Names)
	for i := range lines {
		if i%65536 == 0 && ctx.Err() != nil {
			return d, ctx.Err()
		}
		l, text := g.next()
		if _, err := w.Write(text); err != nil {
			return d, fmt.Errorf("write ledger file: %w", err)
		}
		d.Sums[l.Account] += l.Amount
		d.Counts[l.Account]++
	}
	if err := w.Flush(); err != nil {
		return d, fmt.Errorf("write ledger file: %w", err)
	}
	if err := f.Close(); err != nil {
		return d, fmt.Errorf("close ledger file: %w", err)
	}
	d.Size = g.pos
	return d, nil
}

// generate is the first phase: the ledger file every other phase reads.
func (b *bench) generate(ctx context.Context) error {
	d, err := writeLedger(ctx, b.path("ledger.csv"), b.o.Lines, b.o.Accounts)
	if err != nil {
		return err
	}
	b.data = d
	b.res.Settings.FileBytes = d.Size
	return nil
}
