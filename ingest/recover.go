package ingest

import (
	"context"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/outboxd/outboxd/outbox"
)

// pass is one batch on its way through process: what is left of it, and
// how its failures went so far.
type pass struct {
	b    batch
	head tries // the first record's tries
	size int   // the batch's length when it came
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

func (l *Loop) newPass(b batch) *pass {
	stall := Retry{Attempts: 1, MinDelay: min(time.Second, l.cfg.StallMaxDelay), MaxDelay: l.cfg.StallMaxDelay}
	return &pass{
		b: b, head: firstTries(b), size: len(b.recs), limit: len(b.recs),
		itemWait: l.cfg.Retry.backoff(), commitWait: l.cfg.CommitRetry.backoff(), stallWait: stall.backoff(),
	}
}

// storeFailed decides what follows a transaction the store failed, by the
// error's class (see outbox.Classify):
//   - a corrupt or vanished database, or another process owning it, ends
//     the feed: the error is returned;
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
// the rest of a 16,000-record batch took 16,000 commits (each with its
// fsync and a few pages of WAL) after a disk was freed.
func (l *Loop) storeFailed(ctx context.Context, p *pass, out outcome) error {
	err, class := out.storeFailed, outbox.Classify(out.storeFailed)
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
	if p.b.recs[0].Kind != RecordItem || p.head.spent != nil {
		return false
	}
	p.limit, p.pieces = 1, true
	p.head.spent = Permanent(ReasonConstraint, err)
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
	p.head = firstTries(p.b)
	p.whole()
	return nil
}

// whole ends a search in pieces: the next transaction takes the rest of
// the batch, with the whole retry schedule.
func (p *pass) whole() {
	p.pieces, p.limit, p.fails = false, p.size, 0
	p.commitWait.Reset()
}

// skip moves the feed past recs without their effects, counting a
// completion failure and recording the loss of each partition's range of
// skipped items; cause is why they could not commit.
func (l *Loop) skip(ctx context.Context, recs []Record, cause error) error {
	tx, err := l.store.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	l.obs.begun()
	w := l.newWork(tx)
	lost := map[int32]outbox.Loss{}
	for _, r := range recs {
		switch r.Kind {
		case RecordLoss:
			l.obs.handled(r, Delivery{}, Outcome{})
			if err := l.storeLoss(ctx, w, r); err != nil {
				return err
			}
			continue
		case RecordEpoch:
			l.obs.handled(r, Delivery{}, Outcome{})
			l.changeEpoch(w, r.Partition, r.Epoch, r.Position)
			continue
		}
		l.obs.handled(r, Delivery{Feed: l.cfg.Name, Partition: r.Partition, Topic: r.Topic, Epoch: r.Epoch, Position: r.Position},
			Outcome{Result: ResultSkipped})
		p, cp := r.Partition, w.cps[r.Partition]
		if _, ok := lost[p]; !ok {
			from := cp.Position
			if cp.Epoch != r.Epoch {
				from = 0
			}
			lost[p] = outbox.Loss{Feed: l.cfg.Name, Partition: p, Epoch: r.Epoch, From: from,
				Reason: "completion failure skipped: " + cause.Error()}
		}
		loss := lost[p]
		loss.To = r.Position
		lost[p] = loss
		w.advance(p, r.Epoch, r.Position)
	}
	for _, loss := range lost {
		if err := tx.RecordLoss(ctx, loss); err != nil {
			return err
		}
		l.obs.handled(Record{Kind: RecordLoss, Partition: loss.Partition, Epoch: loss.Epoch,
			From: loss.From, To: loss.To, Reason: loss.Reason}, Delivery{}, Outcome{})
	}
	w.delta.CompletionFailures = 1
	w.records = len(recs)
	l.log.Error("completion failure: skipping, the feed is no longer lossless", "records", len(recs), "err", cause)
	return l.finish(ctx, w)
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
