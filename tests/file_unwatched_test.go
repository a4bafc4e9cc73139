package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/filefeed"
	"github.com/outboxd/outboxd/outbox"
)

// writeOnce appends n fresh ledger lines in one write.
func (in *flInput) writeOnce(n int) {
	data := makeLedger(in.rng, n).data
	f, err := os.OpenFile(in.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		in.fail(err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		in.fail(err)
	}
	in.note(data)
}

// copyAway does what copytruncate does with a collector that ships the
// copy and deletes it at once: the file copied beside itself, truncated in
// place, and the copy moved to away, out of the feed's reach. The model
// keeps the bytes of the epoch up to from: those after it are lost.
func (in *flInput) copyAway(away string, from int64) {
	data, err := os.ReadFile(in.path)
	if err != nil {
		in.fail(err)
	}
	cpy := in.path + ".1"
	if err := os.WriteFile(cpy, data, 0o644); err != nil {
		in.fail(err)
	}
	if err := os.Truncate(in.path, 0); err != nil {
		in.fail(err)
	}
	if err := os.Rename(cpy, filepath.Join(away, fmt.Sprintf("shipped-%d", time.Now().UnixNano()))); err != nil {
		in.fail(err)
	}
	in.cur.data = in.cur.data[:from]
	in.cur = nil
	in.gen++
}

// remove deletes the file at the path; the model keeps the bytes of its
// epoch up to from. The next write creates the path again.
func (in *flInput) remove(from int64) {
	if err := os.Remove(in.path); err != nil {
		in.fail(err)
	}
	in.cur.data = in.cur.data[:from]
	in.cur, in.gen = nil, 0
}

// flWaitEnd waits until the running server p reports that its feed's file
// ends at end: the feed has looked at it since it changed.
func flWaitEnd(t *testing.T, p *proc, end int64) {
	t.Helper()
	m := regexp.MustCompile(`HTTP API listening.* addr=(\S+)`).FindStringSubmatch(p.log.String())
	if m == nil {
		t.Fatal("the server's log names no HTTP address")
	}
	wait(t, 15*time.Second, func() error {
		resp, err := http.Get("http://" + m[1] + "/feeds/ledger/status")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var st api.FeedStatus
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			return fmt.Errorf("status %s: %w", resp.Status, err)
		}
		if st.End != end {
			return fmt.Errorf("the feed's end is %d, want %d", st.End, end)
		}
		return nil
	})
}

// TestFileUnwatched_CopyCollectedWhilePaused: five rounds of lines read,
// SIGSTOP, lines appended, the file copied and truncated with the copy
// shipped away at once, lines appended, SIGCONT. Each round's appended
// lines before the truncation are gone unread: one loss per round, from
// the position read, of unknown extent. Then a round where nothing was
// written between the last read and the truncation, and one write after
// it (its events say so exactly), and a truncation while the server
// watches: no loss.
func TestFileUnwatched_CopyCollectedWhilePaused(t *testing.T) {
	rng := flRand(t)
	dir := t.TempDir()
	away := t.TempDir()
	db := filepath.Join(dir, "outboxd.db")
	in := flNewInput(t, rng, dir)
	in.write(2000)
	p := flStart(t, db, in)
	flCaughtUp(t, db, in)
	var losses []flLoss
	for round := range 5 {
		if round > 0 {
			in.write(2000)
			flCaughtUp(t, db, in)
		}
		flPause(t, p)
		epoch, pos := in.last()
		in.write(300) // never read: the server is paused
		in.copyAway(away, pos)
		in.write(200)
		flResume(t, p)
		flCaughtUp(t, db, in)
		losses = append(losses, flLoss{filefeed.LossUnseenTruncated, epoch.epoch, pos, ingest.UnknownPosition})
	}
	flCheck(t, db, in, losses, p)

	// Nothing written after the last read: the truncation and the one
	// write after it are all the events tell.
	flPause(t, p)
	_, pos := in.last()
	in.copyAway(away, pos)
	in.writeOnce(200)
	flResume(t, p)
	flCaughtUp(t, db, in)
	flCheck(t, db, in, losses, p)

	// Read to its end and truncated while watched (no copy: a feed that
	// looked while the copy was there would read the rest from it).
	_, pos = in.last()
	in.copyTruncate(false, pos)
	flWaitEnd(t, p, 0)
	in.write(100)
	flCaughtUp(t, db, in)
	flCheck(t, db, in, losses, p)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
}

// TestFileUnwatched_DeletedWhileDown: lines read, kill -9, lines appended,
// the file deleted, the server started again, a new file created later.
// The appended lines are gone unread: one loss, from the position read,
// of unknown extent (nothing tells how much was written after the last
// look). The new file is read whole.
func TestFileUnwatched_DeletedWhileDown(t *testing.T) {
	rng := flRand(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "outboxd.db")
	in := flNewInput(t, rng, dir)
	in.write(3000)
	p := flStart(t, db, in)
	flCaughtUp(t, db, in)
	p.kill()
	epoch, pos := in.last()
	in.write(300)
	in.remove(pos)
	p = flStart(t, db, in)
	// The loss is recorded as the feed opens: wait for it before the new
	// file comes, so that the status's figures are the gone file's.
	wait(t, 30*time.Second, func() error {
		s, err := outbox.Open(t.Context(), outbox.DefaultConfig(db))
		if err != nil {
			return err
		}
		defer s.Close()
		ls, err := s.Losses(t.Context(), "ledger")
		if err != nil || len(ls) != 1 {
			return fmt.Errorf("%d losses stored (%v), want 1", len(ls), err)
		}
		return nil
	})
	in.write(500)
	flCaughtUp(t, db, in)
	flCheck(t, db, in, []flLoss{{filefeed.LossVanished, epoch.epoch, pos, ingest.UnknownPosition}}, p)
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
}
