package outbox

// Per-partition owners: many servers on one database.
//
// A feed read through a Kafka consumer group (a group feed) is shared by
// the servers of the group: the group assigns each partition to one of
// them, and the positions stay in this store, as for any feed. The group
// alone cannot keep a server that lost a partition from committing it: a
// server paused (SIGSTOP, a long GC, a full disk), cut off or slow goes on
// with the batch in hand after the group moved the partition to another.
// So each partition has an owner epoch in the store (partition_owners): a
// server the group assigns a partition to takes it with ClaimPartition,
// which bumps the epoch, before it reads the partition's position; and
// every batch transaction that touched the partition (an item, a position,
// a dead letter, a loss of it) reads the epoch inside itself at commit and
// fails with ErrFenced, committing nothing, when it is no longer the one
// this store took. On PostgreSQL the read is FOR SHARE: a claim's update
// waits for a commit in flight, and a commit after the claim sees the new
// epoch. On SQLite the check runs after the batch's first write, under the
// database's one write lock. Either way the new owner reads the position
// after its claim committed, so it resumes exactly where the last commit
// of the old owner left the partition.
//
// The database-wide Claim fences every other server of the database: it is
// for one server alone. Servers that share a database run without it
// (Share), and the partition epochs fence them instead.

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// ErrPartitionFenced is returned (wrapped) by a commit that touched a
// group feed's partition this store no longer holds at its latest epoch:
// the group moved the partition to another server, which applies what the
// commit held. It matches ErrFenced too, but only that transaction is
// refused: the store's other partitions, and the database, are still this
// server's to write. A database-wide fence (Claim) is ErrFenced alone.
var ErrPartitionFenced = fmt.Errorf("%w: a partition moved to another server", ErrFenced)

// PartitionOwner is a group feed's partition as the store has it: its
// owner epoch, the server holding it ("" once released) and when it was
// last claimed.
type PartitionOwner struct {
	Feed      string `db:"feed" json:"feed"`
	Partition int32  `db:"partition" json:"partition"`
	Epoch     int64  `db:"epoch" json:"epoch"`
	Owner     string `db:"owner" json:"owner"`
	ClaimedAt int64  `db:"claimed_at" json:"claimedAt"` // unix nanoseconds
}

// feedPart names one partition of a feed.
type feedPart struct {
	feed      string
	partition int32
}

// partOwners is what a store holds of group feeds: which feeds are, and
// the epoch it took of each partition it holds.
type partOwners struct {
	mu    sync.Mutex
	feeds map[string]bool
	held  map[feedPart]int64
}

func (o *partOwners) grouped(feed string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.feeds[feed]
}

func (o *partOwners) epoch(fp feedPart) (int64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e, ok := o.held[fp]
	return e, ok
}

const (
	claimPartitionSQL = `INSERT INTO partition_owners (feed, partition, epoch, owner, claimed_at) VALUES (?, ?, 1, ?, ?)
ON CONFLICT(feed, partition) DO UPDATE SET epoch = partition_owners.epoch + 1, owner = excluded.owner,
claimed_at = excluded.claimed_at RETURNING epoch`
	// partitionEpochInTxSQL reads a partition's epoch inside a batch's
	// transaction (on PostgreSQL FOR SHARE, see pgDialect).
	partitionEpochInTxSQL = `SELECT epoch FROM partition_owners WHERE feed = ? AND partition = ? /* in the batch */`
	releasePartitionSQL   = `UPDATE partition_owners SET owner = '' WHERE feed = ? AND partition = ? AND epoch = ?`
)

// SetGroupFeed marks feed as a group feed: from now on every commit that
// touches one of its partitions checks that this store holds the
// partition's latest epoch (ClaimPartition), and fails with ErrFenced,
// committing nothing, otherwise.
func (s *Store) SetGroupFeed(feed string) {
	s.parts.mu.Lock()
	defer s.parts.mu.Unlock()
	if s.parts.feeds == nil {
		s.parts.feeds = map[string]bool{}
	}
	s.parts.feeds[feed] = true
	s.grouped.Store(true)
}

// ClaimPartition takes a group feed's partition for this store, as owner
// (a server's id): it bumps the partition's owner epoch, so that a batch
// of the previous holder, committed from now on, fails with ErrFenced. It
// marks feed a group feed (SetGroupFeed) and returns the epoch taken. Read
// the partition's position after it returns.
func (s *Store) ClaimPartition(ctx context.Context, feed string, partition int32, owner string) (int64, error) {
	s.SetGroupFeed(feed)
	var epoch int64
	if err := s.db.GetContext(ctx, &epoch, claimPartitionSQL, feed, partition, owner, s.Now().UnixNano()); err != nil {
		s.noteWrite(err)
		return 0, fmt.Errorf("claim %s[%d]: %w", feed, partition, err)
	}
	s.parts.mu.Lock()
	if s.parts.held == nil {
		s.parts.held = map[feedPart]int64{}
	}
	s.parts.held[feedPart{feed, partition}] = epoch
	s.parts.mu.Unlock()
	s.claims.Add(1)
	return epoch, nil
}

// ReleasePartition lets a partition go: this store commits nothing of it
// any more, and the stored owner is cleared if its epoch is still the one
// this store took (a later claim by another is left as it is).
func (s *Store) ReleasePartition(ctx context.Context, feed string, partition int32) error {
	fp := feedPart{feed, partition}
	s.parts.mu.Lock()
	epoch, ok := s.parts.held[fp]
	delete(s.parts.held, fp)
	s.parts.mu.Unlock()
	if !ok {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, releasePartitionSQL, feed, partition, epoch); err != nil {
		s.noteWrite(err)
		return fmt.Errorf("release %s[%d]: %w", feed, partition, err)
	}
	return nil
}

// PartitionClaims counts the ClaimPartition calls of this store that
// succeeded. A processor that caches state across batches drops its cache
// when it moves: a partition this store takes may have been another
// server's since the cache was filled, so what the cache holds of it may be
// stale.
func (s *Store) PartitionClaims() int64 { return s.claims.Load() }

// HeldPartitions returns the partitions of feed this store holds, in order.
func (s *Store) HeldPartitions(feed string) []int32 {
	s.parts.mu.Lock()
	defer s.parts.mu.Unlock()
	var ps []int32
	for fp := range s.parts.held {
		if fp.feed == feed {
			ps = append(ps, fp.partition)
		}
	}
	slices.Sort(ps)
	return ps
}

// PartitionOwners returns the stored owners of feed's partitions ("" for
// every feed), by feed and partition, through the read-only pool.
func (s *Store) PartitionOwners(ctx context.Context, feed string) ([]PartitionOwner, error) {
	var ps []PartitionOwner
	if err := s.rdb.SelectContext(ctx, &ps, `SELECT feed, partition, epoch, owner, claimed_at FROM partition_owners
WHERE ? = '' OR feed = ? ORDER BY feed, partition`, feed, feed); err != nil {
		return nil, fmt.Errorf("read partition owners: %w", err)
	}
	return ps, nil
}

// touch notes that the transaction wrote something of feed's partition,
// for the owner check at commit. It costs a comparison when the store has
// no group feed, or when the partition is the last one noted.
func (tx *Tx) touch(feed string, partition int32) {
	if !tx.store.grouped.Load() {
		return
	}
	fp := feedPart{feed, partition}
	if n := len(tx.parts); n > 0 && tx.parts[n-1] == fp {
		return
	}
	if slices.Contains(tx.parts, fp) {
		return
	}
	tx.parts = append(tx.parts, fp)
}

// checkPartitions fails with ErrPartitionFenced when a group feed's partition the
// transaction touched is not held by this store at its latest epoch. It
// runs inside the transaction, at commit, so the check and the commit are
// atomic (see the top of this file).
func (tx *Tx) checkPartitions() error {
	for _, fp := range tx.parts {
		if !tx.store.parts.grouped(fp.feed) {
			continue
		}
		held, ok := tx.store.parts.epoch(fp)
		if !ok {
			return fmt.Errorf("%w: %s[%d] is not held by this server", ErrPartitionFenced, fp.feed, fp.partition)
		}
		var epoch int64
		if err := tx.tx.GetContext(txCtx(), &epoch, partitionEpochInTxSQL, fp.feed, fp.partition); err != nil {
			return fmt.Errorf("check owner of %s[%d]: %w", fp.feed, fp.partition, err)
		}
		if epoch != held {
			return fmt.Errorf("%w: %s[%d] has owner epoch %d, this server holds %d", ErrPartitionFenced, fp.feed, fp.partition,
				epoch, held)
		}
	}
	return nil
}
