package ingest

// The failure policy, top to bottom, as docs/guarantees.md tells it:
//
//  1. A batch is applied and committed in one transaction (process).
//  2. An item that fails transiently ends the transaction before it: the
//     items ahead of it commit, and it is tried again alone after a
//     backoff (Config.Retry). Its tries spent, its failure policy
//     (Config.OnFailure) dead-letters it, or stalls the feed on it and
//     tries it again slowly until it succeeds (itemFailed).
//  3. A transaction the store fails is handled by the error's class
//     (storeFailed): a fatal one stops the feed; a broken constraint is
//     the fault of one item, found by halving and dead-lettered; a busy
//     database is retried (Config.CommitRetry); a lasting one, or a busy
//     one whose retries are spent, goes to the completion failure policy
//     (Config.OnCompletionFailure): stall, or skip in pieces.
//  4. A stalled feed tries again with a backoff capped at
//     Config.StallMaxDelay, and resumes by itself at its next commit.
//
// One type keeps the state of all of it for one batch: pass.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/outboxd/outboxd/outbox"
)

// pass is one batch on its way through process: what is left of it, and
// how its failures went so far.
type pass struct {
	b    batch
	size int // the batch's length when it came
	// attempt is the try of the batch's first item this is (1 = first);
	// spent, when set, says it must not be tried again: it is
	// dead-lettered with this error.
	attempt int
	spent   error
	// limit is the most records the next transaction takes: the whole
	// batch, or a piece of it while a failing record is looked for.
	limit int
	// fails counts the store failures in a row since the last commit of
	// the whole batch's remainder.
	fails int
	// pieces is set while the batch is tried in pieces, looking for the
	// record that cannot commit: a piece that commits leaves the limit as
	// it is, and each piece has one try.
	pieces bool
	// stalled is set while the feed is stalled on this batch.
	stalled bool

	itemWait   *backoff.ExponentialBackOff // between an item's tries (Config.Retry)
	commitWait *backoff.ExponentialBackOff // between a transaction's tries (Config.CommitRetry)
	stallWait  *backoff.ExponentialBackOff // between a stalled feed's tries
}

// result is what one transaction over the start of a batch came to, or
// applying one record inside it (then committed is 0). At most one of
// itemFailed and storeFailed is set, but for txLost.
type result struct {
	// committed counts the records committed, from the batch's first.
	committed int
	// itemFailed is the transient error of the item right after them: it
	// is tried again alone, after a backoff; nothing of it is kept.
	itemFailed error
	// storeFailed is why the transaction did not commit; then nothing of
	// it did.
	storeFailed error
	// reached counts the records the failed transaction had taken in, the
	// one being applied when the store failed (or whose failure lost the
	// transaction) included.
	reached int
	// txLost: SQLite rolled the whole transaction back when the item
	// failed (an interrupted write): itemFailed is the item's error, and
	// nothing of the transaction stands.
	txLost bool
}

// newPass starts b's way through process: its first item at its first
// try (or at the try a replay recorded), the whole batch in the next
// transaction.
func (l *Loop) newPass(b batch) *pass {
	stall := Retry{Attempts: 1, MinDelay: min(time.Second, l.cfg.StallMaxDelay), MaxDelay: l.cfg.StallMaxDelay}
	p := &pass{
		b: b, size: len(b.recs), limit: len(b.recs),
		itemWait: l.cfg.Retry.backoff(), commitWait: l.cfg.CommitRetry.backoff(), stallWait: stall.backoff(),
	}
	p.newHead()
	return p
}

// newHead starts the tries of the batch's (new) first record.
func (p *pass) newHead() {
	p.attempt, p.spent = 1, nil
	if len(p.b.recs) > 0 {
		p.attempt, p.spent = replayedTries(p.b.recs[0])
	}
}

// process applies and commits recs, in as many transactions as it takes.
// An item failing transiently ends the transaction before it (the items
// ahead of it are committed) and is tried again alone after a backoff; a
// transaction the store fails is retried, cut in pieces or stalled on, as
// the error and the completion failure policy say (see storeFailed). It
// returns an error only when the feed cannot go on (see Run), or ctx's
// error when ctx ends while it waits. The waits between transactions apply
// the requeues that come meanwhile, so a requeue is never held up by a
// stall.
func (l *Loop) process(ctx context.Context, recs []Record) error {
	p := l.newPass(l.newBatch(recs))
	for len(p.b.recs) > 0 {
		out := l.applyOnce(ctx, p.b.first(p.limit), p.attempt, p.spent)
		var err error
		if out.storeFailed != nil {
			err = l.storeFailed(ctx, p, out)
		} else {
			err = l.committed(ctx, p, out)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// applyOnce applies b's records in one transaction, stopping before an item
// that fails transiently, and commits; attempt and spent are b's first
// record's tries.
//
// When an item's failure made SQLite roll the whole transaction back (a
// write interrupted by the attempt's deadline), nothing of it stands: the
// records before the item are applied again in a new transaction, and the
// failure counts against the item, as any other of its transient failures
// (another try after a backoff, then its failure policy). It is not the
// store's failure: nothing is wrong with the database.
func (l *Loop) applyOnce(ctx context.Context, b batch, attempt int, spent error) result {
	out := l.transact(ctx, b, attempt, spent, false)
	if !out.txLost {
		return out
	}
	lostAt := out.reached - 1
	r := b.recs[lostAt]
	l.log.Warn("an item's failure rolled the whole transaction back: applying the records before it again",
		"partition", r.Partition, "position", r.Position, "records", lostAt, "err", out.itemFailed)
	redo := l.transact(ctx, b.first(lostAt), attempt, spent, lostAt == 0 && attempt > 1)
	if redo.txLost {
		// A record before the item failed this time: that comes first; the
		// item is tried again when its turn comes.
		return result{itemFailed: redo.itemFailed}
	}
	if redo.storeFailed != nil || redo.itemFailed != nil {
		return redo
	}
	return result{committed: redo.committed, itemFailed: out.itemFailed}
}

// committed moves p past what a transaction committed, and decides what
// follows the transient failure of the item after it, if any.
func (l *Loop) committed(ctx context.Context, p *pass, out result) error {
	stallEnded := false
	if out.committed > 0 || out.itemFailed == nil {
		stallEnded = p.stalled
		l.resumed(ctx, p) // it moved: whatever stalled it is gone
	}
	// Whole; or the piece that held the item to dead-letter is in; or a
	// piece ended a stall, so its cause (a full disk, a database that
	// could not be written) is gone and the rest of the batch need not go
	// a record at a time: should it fail again, it is cut again.
	if !p.pieces || (out.committed > 0 && p.spent != nil) || stallEnded {
		p.whole()
	}
	p.b = p.b.from(out.committed)
	if out.committed > 0 { // a new first item: its own tries start over
		p.newHead()
		p.itemWait.Reset()
	}
	if out.itemFailed == nil {
		return nil
	}
	return l.itemFailed(ctx, p, out.itemFailed)
}

// itemFailed decides what follows a transient failure of the first item
// of p: another try after a backoff, or its failure policy once its tries
// are spent: a dead letter, or a stall that tries it again slowly until it
// succeeds.
func (l *Loop) itemFailed(ctx context.Context, p *pass, failed error) error {
	r := p.b.recs[0]
	l.status.setError(failed)
	if p.attempt < l.cfg.Retry.Attempts {
		wait := p.itemWait.NextBackOff()
		l.log.Warn("item failed: will retry", "partition", r.Partition, "position", r.Position, "attempt", p.attempt, "wait", wait, "err", failed)
		if err := l.wait(ctx, wait); err != nil {
			return err
		}
		p.attempt, p.spent = p.attempt+1, nil
		return nil
	}
	if l.cfg.OnFailure == OnFailureStop {
		cause := fmt.Errorf("item at %s[%d] position %d failed %d times: %w", l.cfg.Name, r.Partition, r.Position, p.attempt, failed)
		if err := l.stallOn(ctx, p, cause); err != nil {
			return err
		}
		p.attempt, p.spent = p.attempt+1, nil
		return nil
	}
	l.log.Warn("retries spent: dead-lettering", "partition", r.Partition, "position", r.Position, "attempts", p.attempt, "err", failed)
	p.spent = failed
	return nil
}

// storeFailed decides what follows a transaction the store failed, by the
// error's class (see outbox.Classify):
//   - a corrupt or vanished database, or another process owning it, ends
//     the feed: the error is returned;
//   - a group feed's partition moved to another server
//     (outbox.ErrPartitionFenced) drops the rest of the batch (dropFenced):
//     the new owner applies it, and the feed goes on;
//   - a broken constraint is the fault of one item: the transaction is cut
//     in halves until the item that breaks it is alone, and that item is
//     dead-lettered;
//   - a busy database or an unknown error is retried on the CommitRetry
//     schedule, then goes to the completion failure policy;
//   - a full disk, an I/O error or a database that is not writable go to
//     the policy at once: quick retries do not free a disk.
//
// Under policy stop the feed stalls and retries slowly until the commit
// succeeds; so does it under skip for a full disk. Otherwise, under skip
// the transaction is cut in halves down to one record,
// and only a record that cannot commit alone is skipped, its range recorded
// as a loss; when the skip cannot commit either (it needs the disk too),
// the feed stalls, and tries the record itself again first. Once it
// commits, the rest of the batch is tried whole again: a record at a time,
// it would take a commit (an fsync, a few pages of WAL) per record after a
// disk was freed.
func (l *Loop) storeFailed(ctx context.Context, p *pass, out result) error {
	err, class := out.storeFailed, outbox.Classify(out.storeFailed)
	if errors.Is(err, outbox.ErrPartitionFenced) {
		l.dropFenced(ctx, p, err)
		return nil
	}
	l.status.setError(err)
	if class.Fatal() {
		return fmt.Errorf("feed %s: %s: %w", l.cfg.Name, class, err)
	}
	// No record taken in (BEGIN failed, or the commit of the stats of an
	// item's failed try): no record is to blame, none is skipped.
	reached := min(out.reached, p.limit)
	if class == outbox.ClassConstraint && reached > 0 && l.isolate(p, reached, err) {
		return nil
	}
	p.fails++
	if !class.Lasting() && p.fails < l.cfg.CommitRetry.Attempts {
		wait := p.commitWait.NextBackOff()
		l.log.Warn("batch transaction failed: will retry", "attempt", p.fails, "wait", wait, "class", class, "err", err)
		return l.wait(ctx, wait)
	}
	switch {
	case l.cfg.OnCompletionFailure == OnCompletionSkip && class == outbox.ClassFull:
		// A full disk is no item's fault, and freeing space ends it: no
		// item is dropped for it, whatever of a skip's few writes might
		// still fit.
		return l.stallOn(ctx, p, fmt.Errorf("completion failure: %s: %w; skip never skips for a full disk: it waits for space", class, err))
	case l.cfg.OnCompletionFailure == OnCompletionSkip && reached > 0:
		return l.skipInPieces(ctx, p, reached, class, err)
	}
	return l.stallOn(ctx, p, fmt.Errorf("completion failure: %s: %w", class, err))
}

// isolate cuts the next transaction to half of the reached records, or,
// once the record that breaks a constraint is alone, marks it to be
// dead-lettered. It returns false when the failure cannot be an item's
// (the record alone is not an item, or is the dead letter already).
func (l *Loop) isolate(p *pass, reached int, err error) bool {
	if reached > 1 {
		p.limit, p.pieces = reached/2, true
		l.log.Warn("a constraint broke: looking for the item in smaller transactions", "records", p.limit, "err", err)
		return true
	}
	if p.b.recs[0].Kind != RecordItem || p.spent != nil {
		return false
	}
	p.limit, p.pieces = 1, true
	p.spent = Permanent(ReasonConstraint, err)
	return true
}

// skipInPieces halves the next transaction; once one record alone cannot
// commit, it skips that record, or stalls when the skip cannot commit
// either.
func (l *Loop) skipInPieces(ctx context.Context, p *pass, reached int, class outbox.ErrorClass, err error) error {
	if reached > 1 {
		p.limit, p.pieces = reached/2, true
		// The schedule has shown the failure outlasts retries: one try each.
		p.fails = l.cfg.CommitRetry.Attempts
		l.log.Warn("completion failure: trying the batch in smaller pieces", "records", p.limit, "class", class, "err", err)
		return nil
	}
	if serr := l.skip(ctx, p.b.recs[:1], err); serr != nil {
		return l.stallOn(ctx, p, fmt.Errorf("completion failure: %s: %w; skipping the record needs the database (and its disk) too, and failed: %w",
			class, err, serr))
	}
	l.resumed(ctx, p)
	p.b = p.b.from(1)
	p.newHead()
	p.whole()
	return nil
}

// whole ends a search in pieces: the next transaction takes the rest of
// the batch, with the whole retry schedule.
func (p *pass) whole() {
	p.pieces, p.limit, p.fails = false, p.size, 0
	p.commitWait.Reset()
}

// stallOn stalls the feed on p for cause (once: later causes only update
// the error), then waits the stall's next backoff, capped at
// Config.StallMaxDelay.
func (l *Loop) stallOn(ctx context.Context, p *pass, cause error) error {
	wait := min(p.stallWait.NextBackOff(), l.cfg.StallMaxDelay)
	l.status.stall(cause)
	if !p.stalled {
		p.stalled = true
		l.log.Error("feed stalled: retrying until the cause is gone", "err", cause, "wait", wait)
		if err := l.store.SetLastError(context.WithoutCancel(ctx), l.cfg.Name, cause.Error()); err != nil {
			l.log.Warn("storing the stall's reason", "err", err)
		}
	} else {
		l.log.Warn("feed still stalled", "err", cause, "wait", wait)
	}
	return l.wait(ctx, wait)
}

// resumed ends p's stall, if any, after a commit: the feed moves again.
func (l *Loop) resumed(ctx context.Context, p *pass) {
	if !p.stalled {
		return
	}
	p.stalled = false
	p.stallWait.Reset()
	l.status.move()
	l.log.Info("feed resumed: the stall's cause is gone")
	if err := l.store.SetLastError(context.WithoutCancel(ctx), l.cfg.Name, ""); err != nil {
		l.log.Warn("clearing the stall's reason", "err", err)
	}
}

// dropFenced drops what is left of p, and the records set aside for the
// next batch, after a commit was fenced on a group feed's partition that
// moved to another server (err wraps outbox.ErrPartitionFenced): nothing of
// the transaction committed, and the new owner applies the partition's
// records from the position the store has. The feed is told (Dropper), so
// that it yields again, from the store's positions, what it still holds of
// the other partitions among them; the loop goes on with the partitions
// the feed holds.
func (l *Loop) dropFenced(ctx context.Context, p *pass, err error) {
	dropped := append(p.b.recs[:len(p.b.recs):len(p.b.recs)], l.carry...)
	l.carry = l.carry[:0]
	l.log.Info("a partition moved to another server: its batch is dropped, the new owner applies it",
		"records", len(dropped), "err", err)
	l.resumed(ctx, p)
	p.b = batch{}
	if d, ok := l.feed.(Dropper); ok {
		d.Dropped(ctx, dropped)
	}
}
