package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
)

// benchLine is one generated line.
type benchLine struct {
	Index    int64 // 0-based
	Account  int   // the account's number: its name is "acct-<Account>"
	Amount   int64
	Position int64 // the byte offset after the line: the file feed's position of it
}

// lineGen yields the bench's lines "acct-N,AMOUNT" in order, padded to
// lineBytes with spaces (the ledger ignores them; forward ships them) or,
// with fill "random", a space and then letters and digits that LZ4 finds
// nothing to compress in (forward only). They
// are a pure function of the line index, so every phase and the verifier
// regenerate them instead of keeping them in memory; an account's name is
// made from its number on the fly, so a state of ten million accounts
// costs the bench no memory.
type lineGen struct {
	accounts  int
	lineBytes int // 0: no padding
	random    bool
	i         int64
	pos       int64
	buf       []byte
}

// Fills of the padding (--line-fill).
const (
	fillSpaces = "spaces"
	fillRandom = "random"
)

// newLineGen starts at the first line.
func newLineGen(accounts, lineBytes int, fill string) *lineGen {
	return &lineGen{accounts: accounts, lineBytes: lineBytes, random: fill == fillRandom, buf: make([]byte, 0, max(64, lineBytes))}
}

// padChars are the random fill's characters.
const padChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// next returns the next line and its text, "\n" included. The text is
// valid until the following call.
func (g *lineGen) next() (benchLine, []byte) {
	h := mix64(uint64(g.i))
	l := benchLine{Index: g.i, Account: int(h % uint64(g.accounts)), Amount: int64((h>>32)%2001) - 1000}
	g.buf = appendAccount(g.buf[:0], l.Account)
	g.buf = append(g.buf, ',')
	g.buf = strconv.AppendInt(g.buf, l.Amount, 10)
	if g.random && len(g.buf) < g.lineBytes-1 {
		g.buf = append(g.buf, ' ')
		for x := h; len(g.buf) < g.lineBytes-1; {
			x = mix64(x)
			g.buf = append(g.buf, padChars[x%uint64(len(padChars))])
		}
	}
	for len(g.buf) < g.lineBytes-1 {
		g.buf = append(g.buf, ' ')
	}
	g.buf = append(g.buf, '\n')
	g.pos += int64(len(g.buf))
	g.i++
	l.Position = g.pos
	return l, g.buf
}

// appendAccount appends account i's name.
func appendAccount(b []byte, i int) []byte {
	return strconv.AppendInt(append(b, "acct-"...), int64(i), 10)
}

// accountName is account i's name.
func accountName(i int) string { return string(appendAccount(nil, i)) }

// mix64 is SplitMix64's finalizer: well-spread accounts and amounts from a
// counter, the same on every run.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// maxVerifyAccounts bounds the accounts whose expected balances a run keeps
// (16 bytes each) to check the end-to-end outputs.
const maxVerifyAccounts = 2_000_000

// lineData describes a generated file and what applying it must give.
type lineData struct {
	Path      string
	Lines     int64
	Size      int64
	Accounts  int
	LineBytes int
	Fill      string
	// Sums and Counts are each account's expected balance change and line
	// count; nil past maxVerifyAccounts.
	Sums   []int64
	Counts []int64
}

// gen starts a generator of d's lines.
func (d lineData) gen() *lineGen { return newLineGen(d.Accounts, d.LineBytes, d.Fill) }

// writeLines writes lines generated lines to path, streaming, and returns
// what they hold.
func writeLines(ctx context.Context, path string, lines int64, accounts, lineBytes int, fill string) (lineData, error) {
	d := lineData{Path: path, Lines: lines, Accounts: accounts, LineBytes: lineBytes, Fill: fill}
	if accounts <= maxVerifyAccounts {
		d.Sums, d.Counts = make([]int64, accounts), make([]int64, accounts)
	}
	f, err := os.Create(path)
	if err != nil {
		return d, fmt.Errorf("create line file: %w", err)
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	g := d.gen()
	for i := range lines {
		if i%65536 == 0 && ctx.Err() != nil {
			return d, ctx.Err()
		}
		l, text := g.next()
		if _, err := w.Write(text); err != nil {
			return d, fmt.Errorf("write line file: %w", err)
		}
		if d.Sums != nil {
			d.Sums[l.Account] += l.Amount
			d.Counts[l.Account]++
		}
	}
	if err := w.Flush(); err != nil {
		return d, fmt.Errorf("write line file: %w", err)
	}
	if err := f.Close(); err != nil {
		return d, fmt.Errorf("close line file: %w", err)
	}
	d.Size = g.pos
	return d, nil
}

// generate is the first phase: the file every other phase reads.
func (b *bench) generate(ctx context.Context) error {
	path, err := b.inputPath("lines.txt")
	if err != nil {
		return err
	}
	d, err := writeLines(ctx, path, b.o.Lines, b.o.Accounts, b.o.LineBytes, b.o.LineFill)
	if err != nil {
		return err
	}
	b.data = d
	b.res.Settings.FileBytes = d.Size
	return nil
}

// lexOrder calls f with 0 .. n-1 in the order of their decimal strings
// ("0", "1", "10", "100", ..., "2", ...), the order of the accounts' names,
// without holding them.
func lexOrder(n int, f func(int) error) error {
	if n <= 0 {
		return nil
	}
	if err := f(0); err != nil {
		return err
	}
	m, cur := n-1, 1
	for range m {
		if err := f(cur); err != nil {
			return err
		}
		if cur*10 <= m {
			cur *= 10
			continue
		}
		if cur >= m {
			cur /= 10
		}
		cur++
		for cur%10 == 0 {
			cur /= 10
		}
	}
	return nil
}
