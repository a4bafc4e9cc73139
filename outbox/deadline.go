package outbox

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"unsafe"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

// deadlineWatch binds the statements of a Tx's Batch calls to their
// context with one watcher per context per transaction, where the driver
// would start one goroutine per statement (and install its progress
// handler, and swap its wait context) to watch the same context. The
// loop hands the items of a few milliseconds one context, so a batch of
// 16,000 items watches a few dozen contexts, not 48,000 statements.
//
// The statements then run with no context of the driver's: the watch
// gives them the three things the driver's own watch would.
//   - A statement under way when the context ends is interrupted
//     (sqlite3_interrupt), and so is one whose interrupt SQLite cleared
//     because it came before the statement started: the progress handler
//     stops it within 1,000 steps.
//   - A wait for a lock ends once the context is done: the driver's busy
//     handler and its shared-cache wait watch the connection's wait
//     context, set to the statement's.
//   - A statement that fails once its context ended fails with the
//     context's error.
//
// The interrupt reaches the connection only while a Batch call of the
// Tx is running (active): what the Tx runs for itself in between (the
// savepoint's RELEASE, the outputs at Commit) is bound to no context.
type deadlineWatch struct {
	mu       sync.Mutex
	ctx      context.Context // the context watched, nil for none
	stop     func() bool     // ends the watch of ctx
	db       uintptr         // the connection's sqlite3* handle, while active
	active   bool            // a Batch call is running
	canceled atomic.Int32    // the watch interrupted the connection; read by the progress handler
	tls      *libc.TLS       // for the calls of the connection's holder (begin, end)
}

// driverConnLayout is where the driver keeps, in its unexported
// connection, the sqlite3* handle and the wait context its busy handler
// watches: modernc.org/sqlite exports neither, nor an interrupt. They are
// found by name and type once; a driver without them is an error at the
// first statement, never a statement run unbound.
type driverConnLayout struct {
	typ     reflect.Type
	db      uintptr // offset of the sqlite3* handle (uintptr)
	waitCtx uintptr // offset of the wait context (context.Context)
	err     error
}

var connLayout struct {
	once sync.Once
	l    driverConnLayout
}

// layoutOf returns the layout of the driver connection dc.
func layoutOf(dc any) (*driverConnLayout, error) {
	connLayout.once.Do(func() { connLayout.l = findLayout(reflect.TypeOf(dc)) })
	l := &connLayout.l
	if l.err != nil {
		return nil, l.err
	}
	if reflect.TypeOf(dc) != l.typ {
		return nil, fmt.Errorf("the SQLite driver's connection is a %v, not the %v whose deadline outboxd watches", reflect.TypeOf(dc), l.typ)
	}
	return l, nil
}

func findLayout(t reflect.Type) driverConnLayout {
	l := driverConnLayout{typ: t}
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		l.err = fmt.Errorf("the SQLite driver's connection is a %v, not a pointer to a struct", t)
		return l
	}
	db, ok := t.Elem().FieldByName("db")
	if !ok || db.Type.Kind() != reflect.Uintptr {
		l.err = errors.New("the SQLite driver's connection has no handle to interrupt a statement with")
		return l
	}
	wc, ok := t.Elem().FieldByName("waitCtx")
	if !ok || wc.Type != reflect.TypeFor[context.Context]() {
		l.err = errors.New("the SQLite driver's connection has no wait context to bound its lock waits with")
		return l
	}
	l.db, l.waitCtx = db.Offset, wc.Offset
	return l
}

// handle is dc's sqlite3* handle.
func (l *driverConnLayout) handle(dc any) uintptr {
	return *(*uintptr)(unsafe.Add(reflect.ValueOf(dc).UnsafePointer(), l.db))
}

// setWaitCtx makes ctx the context the driver's lock waits on dc watch.
func (l *driverConnLayout) setWaitCtx(dc any, ctx context.Context) {
	*(*context.Context)(unsafe.Add(reflect.ValueOf(dc).UnsafePointer(), l.waitCtx)) = ctx
}

// bind prepares the statement about to run on dc with ctx: it returns the
// context to give the driver (none when the watch has ctx in hand), or
// ctx's error when it is done. The caller passes the statement's error
// through w.failed.
func (w *deadlineWatch) bind(ctx context.Context, dc any) (context.Context, error) {
	if ctx.Done() == nil {
		return ctx, nil // nothing to watch: the driver watches nothing either
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l, err := layoutOf(dc)
	if err != nil {
		return nil, err
	}
	if !w.active {
		w.begin(l.handle(dc))
	}
	if w.ctx != ctx {
		w.watch(ctx)
	}
	l.setWaitCtx(dc, ctx)
	return context.Background(), nil
}

// begin makes the watch active for a Batch call on the connection db.
func (w *deadlineWatch) begin(db uintptr) {
	w.mu.Lock()
	w.db, w.active = db, true
	w.canceled.Store(0)
	w.mu.Unlock()
	progressFlags.Store(db, &w.canceled)
	// SQLite clears an interrupt that comes before the statement's first
	// step: the handler stops such a statement within 1,000 steps.
	if w.tls == nil {
		w.tls = libc.NewTLS()
	}
	sqlite3.Xsqlite3_progress_handler(w.tls, db, 1000, progressFunc, db)
}

// watch replaces the context watched with ctx.
func (w *deadlineWatch) watch(ctx context.Context) {
	w.unwatch()
	w.mu.Lock()
	w.ctx = ctx
	w.mu.Unlock()
	w.stop = context.AfterFunc(ctx, func() { w.interrupt(ctx) })
}

// close ends the watch and frees what it holds: the store closes.
func (w *deadlineWatch) close() {
	w.unwatch()
	if w.tls != nil {
		w.tls.Close()
		w.tls = nil
	}
}

// unwatch ends the watch of the current context, if any: the transaction
// ends.
func (w *deadlineWatch) unwatch() {
	if w.stop != nil {
		w.stop()
		w.stop = nil
	}
	w.mu.Lock()
	w.ctx = nil
	w.mu.Unlock()
}

// interrupt runs once ctx is done, on a goroutine of its own: it may run
// after the watch moved to another context, and then does nothing.
func (w *deadlineWatch) interrupt(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.active || w.ctx != ctx {
		return
	}
	w.canceled.Store(1)
	// A TLS of its own: the connection's may be in use by the step this
	// interrupts.
	tls := libc.NewTLS()
	sqlite3.Xsqlite3_interrupt(tls, w.db)
	tls.Close()
}

// failed is the error of a statement run with ctx that failed with err:
// ctx's error when ctx ended it.
func (w *deadlineWatch) failed(ctx context.Context, err error) error {
	if err == nil || ctx.Done() == nil {
		return err
	}
	if cerr := ctx.Err(); cerr != nil && (w.canceled.Load() != 0 || endedByContext(err)) {
		return cerr
	}
	return err
}

// endedByContext reports whether err is what a statement fails with when
// its context ends it: an interrupt, or a lock wait the busy handler gave
// up.
func endedByContext(err error) bool {
	code, ok := SQLiteCode(err)
	if !ok {
		return true
	}
	switch code & 0xff {
	case sqlite3.SQLITE_INTERRUPT, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return true
	}
	return false
}

// end ends the Batch call on dc: no interrupt reaches the connection
// past it (one under way is waited for), and its waits watch no context
// of the Tx's any more. The context stays watched for the next call.
func (w *deadlineWatch) end(dc any) {
	if !w.active {
		return
	}
	w.mu.Lock()
	w.active = false
	db := w.db
	w.mu.Unlock()
	sqlite3.Xsqlite3_progress_handler(w.tls, db, 0, 0, 0)
	progressFlags.Delete(db)
	if l, err := layoutOf(dc); err == nil {
		l.setWaitCtx(dc, nil)
	}
}

// progressFlags maps a connection's handle to its watch's canceled flag,
// which progressCanceled reads.
var progressFlags sync.Map // uintptr -> *atomic.Int32

// progressCanceled is the progress handler of a watched connection: a
// non-zero answer interrupts the statement under way.
func progressCanceled(_ *libc.TLS, db uintptr) int32 {
	if f, ok := progressFlags.Load(db); ok {
		return f.(*atomic.Int32).Load()
	}
	return 0
}

// progressFunc is progressCanceled as the C function pointer SQLite
// calls: the transpiled SQLite calls a pointer as the Go function value
// it stands for.
var progressFunc = *(*uintptr)(unsafe.Pointer(&struct {
	f func(*libc.TLS, uintptr) int32
}{progressCanceled}))
