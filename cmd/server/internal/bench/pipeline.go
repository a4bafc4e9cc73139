package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// pipelineBytes bounds what raw_pipeline builds before its timer: it runs
// over the file's first lines that fit, counting pipelineLineCost bytes a
// line beyond twice the line's own (the floor's statement arguments and
// the record with its headers). With the default 1,000,000 short lines the
// whole file fits; the bench's peak RSS is then about 0.6 GiB for
// forward lines and 1.0 GiB for the ledger's, whose outputs are longer
// than its lines.
const (
	pipelineBytes    = 1536 << 20
	pipelineLineCost = 1200
)

// runRawPipeline measures the end-to-end ceiling: raw_sqlite's loop and
// raw_produce's producer running at once on the same machine, the
// producer sending each batch's records as soon as the loop has committed
// it (the least an exactly-once relay must wait for) and taking what is
// committed, up to --relay-batch, per transaction, as the relay does. Both
// work on inputs built before the timer, so neither pays for the other's
// preparation, and nothing reads the rows back: the producer holds the
// records the loop writes. Its CPU per line is the process's and the
// broker's over the timed part, both stages together.
//
// Its transactions close as the server's batches do at full speed: at
// --batch-max lines or once --batch-wait has passed, here the lines
// raw_sqlite wrote in --batch-wait (pipelineBatch). Batches of
// --batch-max alone made the producer wait for each 16,000-line commit
// while the server's relay was already sending the first 5 ms of it: with
// 1 KiB lines end_to_end was 1.06 of the pipeline (1.40 with lines LZ4
// cannot compress).
//
// On a machine with fewer cores than the stages need this is the
// tightest figure end_to_end can be held to; the slower of raw_sqlite
// and raw_produce alone is not, since each of those had the machine to
// itself.
func (b *bench) runRawPipeline(ctx context.Context) error {
	p, done, err := b.fileProducer(ctx, "pipeline")
	if err != nil {
		return err
	}
	defer done()
	f, err := openFloorDB(ctx, b.path("pipeline.db"), b.o.Synchronous)
	if err != nil {
		return err
	}
	defer f.close()
	lines := pipelineLines(b.data.Lines, b.o.LineBytes)
	b.res.Settings.PipelineBatch = b.pipelineBatch()
	batches, msgs := b.pipelineInputs(p, lines, b.res.Settings.PipelineBatch)
	collected := withoutGC()
	m := b.startInProcess()
	t0 := time.Now()
	err = runPipeline(ctx, f, p, batches, msgs, b.data.Size, b.o.RelayBatch)
	d := time.Since(t0)
	collected()
	if err != nil {
		return err
	}
	res := newPhaseResult(lines, d)
	m.finish(b, "raw_pipeline", res)
	b.res.RawPipeline = res
	batches, msgs = nil, nil
	releaseMemory()
	return nil
}

// pipelineBatch is raw_pipeline's lines per transaction: what raw_sqlite
// wrote in --batch-wait, within 1 and --batch-max (--batch-max when
// raw_sqlite did not run).
func (b *bench) pipelineBatch() int64 {
	n := int64(b.o.BatchMax)
	if r := b.res.RawSQLite; r != nil && r.PerSecond > 0 && b.o.BatchWait > 0 {
		n = min(n, max(1, int64(r.PerSecond*b.o.BatchWait.Seconds())))
	}
	return n
}

// pipelineLines is how many of the file's lines raw_pipeline runs over:
// all of them, unless their inputs would be over pipelineBytes.
func pipelineLines(lines int64, lineBytes int) int64 {
	per := int64(pipelineLineCost + 2*max(lineBytes, 64))
	return max(1, min(lines, pipelineBytes/per))
}

// pipelineInputs builds the floor batches, of batch lines each, of the
// file's first lines and, from the same rows, the records the relay would
// send for them.
func (b *bench) pipelineInputs(p *rawProducer, lines, batch int64) ([]floorBatch, []*sarama.ProducerMessage) {
	in := &floorInputs{g: b.data.gen(), processor: b.o.Processor, topic: p.topic,
		start: func(int) int64 { return 0 }, balances: map[int]int64{}, keepRows: true}
	var batches []floorBatch
	msgs := make([]*sarama.ProducerMessage, 0, lines)
	for left := lines; left > 0; left -= batch {
		fb := in.batch(min(left, batch))
		at := time.Now() // the rows of one commit share their creation time
		for _, r := range fb.rows {
			msgs = append(msgs, p.record(int64(len(msgs))+1, r.pos, at, r.key, r.value))
		}
		fb.rows = nil
		batches = append(batches, fb)
	}
	return batches, msgs
}

// runPipeline writes the batches on one goroutine and publishes their
// records on this one, each transaction of at most relayBatch records
// taken from what is committed. It returns when every record is
// published, or at the first error of either stage.
func runPipeline(ctx context.Context, f *floorDB, p *rawProducer, batches []floorBatch,
	msgs []*sarama.ProducerMessage, size int64, relayBatch int) error {
	// committed carries the count of records whose rows are committed;
	// the writer never blocks on it.
	committed := make(chan int, len(batches))
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	werr := make(chan error, 1)
	go func() {
		defer close(committed)
		// As in raw_sqlite, statements get a context that is never done;
		// the run's is checked between batches.
		sctx := context.WithoutCancel(wctx)
		n := 0
		for _, fb := range batches {
			if err := wctx.Err(); err != nil {
				werr <- err
				return
			}
			if err := f.write(sctx, fb, size); err != nil {
				werr <- err
				return
			}
			n += int(fb.lines)
			committed <- n
		}
		werr <- nil
	}()
	sent, avail := 0, 0
	for sent < len(msgs) {
		if avail == sent {
			n, ok := <-committed
			if !ok {
				break
			}
			avail = n
		}
		// Take every commit already made, as the relay reads all it can.
		for drained := false; !drained; {
			select {
			case n, ok := <-committed:
				if !ok {
					drained = true
				} else {
					avail = n
				}
			default:
				drained = true
			}
		}
		k := min(relayBatch, avail-sent)
		if err := p.txn(ctx, msgs[sent:sent+k]); err != nil {
			stop()
			<-werr
			return err
		}
		sent += k
	}
	if err := <-werr; err != nil {
		return err
	}
	if sent != len(msgs) {
		return fmt.Errorf("raw_pipeline published %d of %d records", sent, len(msgs))
	}
	return nil
}
