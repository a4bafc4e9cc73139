package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/outboxd/outboxd/internal/testutil"
)

// chromiumPath is where .ci/run installs Chromium.
const chromiumPath = "/usr/bin/chromium"

// TestBrowser_Dashboard opens the dashboard of the real binary in headless
// Chromium and watches it follow the server without a reload, through the
// four scenes its screenshots show (docs/dashboard*.png with
// OUTBOXD_DASHBOARD_SCREENSHOTS=$PWD/../docs): all well, with the charts
// drawn from the server's history with labelled axes; dead letters, read
// with a token and resolved (one requeued with an edited payload, one
// discarded with a note); a loss, the banner critical within two seconds
// and the losses acknowledged with a reason; backpressure while Kafka is
// away. A stalled feed makes the banner critical until it recovers; a new
// tab shows the history at once. The page logs no console error.
func TestBrowser_Dashboard(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no %s (install chromium to run the browser test): %v", chromiumPath, err)
		}
		t.Fatalf("CI is set but %s is missing: %v", chromiumPath, err)
	}
	dir := t.TempDir()
	input, stuck := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "stuck.csv")
	failFlag := filepath.Join(dir, "fail-commits")
	const token = "dashboard-test-token-0123456789"
	// A line over --max-line 16 is a dead letter keeping its first 16 bytes.
	const longLine = "acct-9,100000000777\n"
	lines := "acct-1,10\nacct-2,5\n"
	for path, body := range map[string]string{input: lines, stuck: ""} {
		writeFile(t, path, body)
	}
	px := startProxiedBroker(t)
	addr := "127.0.0.1:" + freePort(t)
	base := "http://" + addr
	start(t, []string{"OUTBOXD_TEST_FAIL_COMMITS=" + failFlag},
		"--db", filepath.Join(dir, "outboxd.db"), "--brokers", px.Addr(), "--http", addr, "--api-token", "alice="+token,
		"--max-line", "16", "--max-backlog-rows", "20", "--max-backlog-bytes", "1GiB", "--batch-max", "10",
		"--feed", "ledger=file:"+input, "--processor", "ledger=ledger", "--on-completion-failure", "ledger=skip",
		"--feed", "stuck=file:"+stuck, "--feed", "later=file:"+filepath.Join(dir, "later.csv"))
	wait(t, 30*time.Second, func() error { return httpOK(base + "/readyz") })

	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	ctx = browser(t, ctx)
	consoleErrors := watchConsole(t, ctx)
	row := `tr.feed[data-feed="ledger"]`
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/")); err != nil {
		t.Fatalf("open the dashboard: %v", err)
	}
	pos := len(lines)
	waitText(t, ctx, row+" td.position", fmt.Sprintf("%d / %d", pos, pos))
	waitText(t, ctx, row+" td.lag", "0 bytes")
	waitText(t, ctx, `tr.feed[data-feed="later"] td.state`, "waiting for its source")
	// A mark on the page: a reload would wipe it.
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.outboxdMark = "still here"`)); err != nil {
		t.Fatal(err)
	}

	// All well: the banner is the server's verdict; the charts have their
	// units and a time axis ending now.
	appendFile(t, input, "acct-3,7\n")
	pos += len("acct-3,7\n")
	waitText(t, ctx, row+" td.position", fmt.Sprintf("%d / %d", pos, pos))
	waitJS(t, ctx, `document.getElementById("health").dataset.level === "ok"`)
	waitText(t, ctx, "#health-message", "healthy")
	waitJS(t, ctx, `Number(document.getElementById("rate-graph").dataset.samples) >= 5`)
	waitText(t, ctx, "#rate-graph text.unit", "per second")
	waitText(t, ctx, "#backlog-graph text.unit", "rows waiting")
	waitJS(t, ctx, `[...document.querySelectorAll("#rate-graph text.tick.x")].some((e) => e.textContent === "now")`)
	waitJS(t, ctx, `document.querySelectorAll("#rate-graph polyline.ingest").length === 1`)
	click(t, ctx, `button.open-feed[data-feed="ledger"]`)
	waitText(t, ctx, "#lag-graph text.unit", "lag (bytes)")
	screenshot(t, ctx, "dashboard.png")

	// Dead letters: the banner warns; reading them asks for the token.
	appendFile(t, input, "junk\n"+longLine)
	pos += len("junk\n" + longLine)
	waitText(t, ctx, "#health-message", "2 dead letters of feed ledger in the last hour, not resolved")
	waitJS(t, ctx, `document.getElementById("health").dataset.level === "warning"`)
	waitText(t, ctx, "#health-action", "outboxd dead-letters list ledger")
	click(t, ctx, "#dl-reload")
	click(t, ctx, "#dl-token")
	giveToken(t, ctx, token)
	waitText(t, ctx, "#dead-letters tbody", "line-too-long")
	waitText(t, ctx, "#dl-reasons", "requeue all malformed")
	junk := deadLetterID(t, ctx, "junk")
	long := deadLetterID(t, ctx, "acct-9,100000000")
	screenshot(t, ctx, "dashboard-dead-letters.png")
	before := feedStatus(t, base, "ledger").Applied
	click(t, ctx, fmt.Sprintf(`#dead-letters tr[data-id="%s"] button.edit`, junk))
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS("#dl-edit-payload"), "acct-5,1")); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#dl-edit-note"), "a typo")); err != nil {
		t.Fatal(err)
	}
	click(t, ctx, "#dl-edit-apply")
	waitText(t, ctx, "#action-result", "dead letter "+junk+" of ledger requeued with the edited payload")
	waitText(t, ctx, fmt.Sprintf(`#dead-letters tr[data-id="%s"] td.action`, junk), "by alice (edited)")
	if after := feedStatus(t, base, "ledger").Applied; after != before+1 {
		t.Fatalf("applied %d, want %d: the edited line applied once", after, before+1)
	}
	click(t, ctx, fmt.Sprintf(`#dead-letters tr[data-id="%s"] button.discard`, long))
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(fmt.Sprintf(`#dead-letters tr[data-id="%s"] .note-form input`, long)), "a test line")); err != nil {
		t.Fatal(err)
	}
	click(t, ctx, fmt.Sprintf(`#dead-letters tr[data-id="%s"] button.discard`, long))
	waitText(t, ctx, fmt.Sprintf(`#dead-letters tr[data-id="%s"] td.action`, long), "by alice: a test line")
	waitJS(t, ctx, `document.getElementById("health").dataset.level === "ok"`)
	checkResolved(t, base, token, junk, long)

	// A loss: every try of the next batch fails, a completion failure
	// skipped under policy skip. Critical within two seconds.
	writeFile(t, failFlag, "5")
	appendFile(t, input, "acct-4,1\n")
	lostFrom, lostTo := pos, pos+len("acct-4,1\n")
	pos = lostTo
	var lostAt time.Time
	wait(t, 30*time.Second, func() error {
		if feedStatus(t, base, "ledger").Lossless {
			return errors.New("the API still says lossless")
		}
		lostAt = time.Now()
		return nil
	})
	waitTextUntil(t, ctx, lostAt.Add(2*time.Second), "#health-message", "feed ledger is NOT LOSSLESS")
	waitJS(t, ctx, `document.getElementById("health").dataset.level === "critical"`)
	waitText(t, ctx, row+" .badge.lossy", "NOT LOSSLESS")
	waitText(t, ctx, `tr.loss-row[data-feed="ledger"]`, fmt.Sprintf("partition 0, %d–%d", lostFrom, lostTo))
	waitText(t, ctx, `tr.loss-row[data-feed="ledger"]`, "completion failure skipped")
	screenshot(t, ctx, "dashboard-loss.png")
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#ack-reason"), "re-sent by the upstream")); err != nil {
		t.Fatal(err)
	}
	click(t, ctx, "#ack-losses")
	waitText(t, ctx, "#action-result", "losses of ledger acknowledged by alice")
	waitText(t, ctx, row+" td.lossless", "lossless")
	waitText(t, ctx, "#detail-losses", "acknowledged by alice: re-sent by the upstream")
	waitJS(t, ctx, `document.getElementById("health").dataset.level === "ok"`)

	// Backpressure: Kafka away, ingest stops at the backlog's bound.
	px.setDown(true)
	var more strings.Builder
	for i := range 200 {
		fmt.Fprintf(&more, "acct-%d,1\n", i%7)
	}
	appendFile(t, input, more.String())
	waitText(t, ctx, row+" td.state", "backpressured")
	waitText(t, ctx, "#health-message", "feed ledger waits for the relay")
	waitText(t, ctx, "#health-others", "the relay is not connected")
	waitJS(t, ctx, `Number(document.getElementById("relay-pending").textContent.split(" ")[0]) > 20`)
	waitJS(t, ctx, `Number(document.getElementById("backlog-graph").dataset.last) > 20`) // the history has it too
	screenshot(t, ctx, "dashboard-backpressure.png")
	px.setDown(false)
	pos += more.Len()
	waitText(t, ctx, row+" td.position", fmt.Sprintf("%d / %d", pos, pos))
	waitJS(t, ctx, `document.getElementById("health").dataset.level === "ok"`)

	// A stall: 8 failing commits of the stuck feed (policy stop): 5 tries,
	// then retries 1s, 2s and 4s later; the next goes through.
	writeFile(t, failFlag, "8")
	appendFile(t, stuck, "x\n")
	// The database's failed writes may come first: the stall is listed too.
	waitText(t, ctx, "#health", "feed stuck is STALLED")
	waitJS(t, ctx, `document.getElementById("health").dataset.level === "critical"`)
	waitText(t, ctx, `tr.feed[data-feed="stuck"] td.state`, "STALLED")
	waitText(t, ctx, `tr.feed[data-feed="stuck"] td.position`, "2 / 2")
	waitJS(t, ctx, `document.getElementById("health").dataset.level === "ok"`)

	// A new tab draws the server's history at once.
	var served struct{ Times []int64 }
	if err := getJSON(base+"/history", &served); err != nil {
		t.Fatal(err)
	}
	tab, closeTab := chromedp.NewContext(ctx)
	defer closeTab()
	if err := chromedp.Do(tab, chromedp.Navigate(base+"/")); err != nil {
		t.Fatal(err)
	}
	waitJS(t, tab, fmt.Sprintf(`Number(document.getElementById("rate-graph").dataset.samples) >= %d`, len(served.Times)))

	mark, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.outboxdMark || ""`))
	if err != nil || mark != "still here" {
		t.Fatalf("the page was reloaded (mark %q, %v): it must update itself", mark, err)
	}
	if errs := consoleErrors(); len(errs) > 0 {
		t.Fatalf("the page logged errors:\n%s", strings.Join(errs, "\n"))
	}
}

// screenshot saves the page as name: into $OUTBOXD_DASHBOARD_SCREENSHOTS
// (the pictures of README and docs/http-api.md: OUTBOXD_DASHBOARD_SCREENSHOTS=$PWD/../docs), or the
// test's artifacts.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := t.ArtifactDir()
	if d := os.Getenv("OUTBOXD_DASHBOARD_SCREENSHOTS"); d != "" {
		dir = d
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("dashboard screenshot: %s", filepath.Join(dir, name))
}

// giveToken types the token into the page's prompt for it.
func giveToken(t *testing.T, ctx context.Context, token string) {
	t.Helper()
	waitJS(t, ctx, `!document.getElementById("token").hidden`)
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#token-input"), token)); err != nil {
		t.Fatal(err)
	}
	click(t, ctx, "#token-use")
	stored, err := chromedp.Run(ctx, chromedp.Evaluate[string](`sessionStorage.getItem("outboxd.adminToken") + "|" + localStorage.length`))
	if err != nil || stored != token+"|0" {
		t.Fatalf("storage %q (%v): the token belongs in sessionStorage only", stored, err)
	}
}

// deadLetterID is the id of the dead letter row whose payload is payload.
func deadLetterID(t *testing.T, ctx context.Context, payload string) string {
	t.Helper()
	q, _ := json.Marshal(payload)
	var id string
	wait(t, 20*time.Second, func() (err error) {
		id, err = chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(() => {
			const tr = [...document.querySelectorAll("#dead-letters tr.dead-letter")].find((r) => r.querySelector("td.payload").textContent === %s);
			return tr ? tr.dataset.id : "";
		})()`, q)))
		if err == nil && id == "" {
			err = errors.New("no dead letter row with the payload")
		}
		return err
	})
	return id
}

// feedStatus reads a feed's status from the API.
func feedStatus(t *testing.T, base, name string) struct {
	Applied  int64
	Lossless bool
} {
	t.Helper()
	var st struct {
		Applied  int64
		Lossless bool
	}
	if err := getJSON(base+"/feeds/"+name+"/status", &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// checkResolved reads the two dead letters back from the API: the one
// requeued with an edited payload, the other discarded, both by alice.
func checkResolved(t *testing.T, base, token, requeued, discarded string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/feeds/ledger/dead-letters", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var page struct {
		DeadLetters []struct {
			ID                           int64
			Resolution, ResolvedBy, Note string
			RequeueEdited                bool
		}
	}
	if err := json.NewDecoder(res.Body).Decode(&page); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, dl := range page.DeadLetters {
		got[fmt.Sprint(dl.ID)] = fmt.Sprintf("%s by %s (%s) edited %v", dl.Resolution, dl.ResolvedBy, dl.Note, dl.RequeueEdited)
	}
	if got[requeued] != "requeued by alice (a typo) edited true" || got[discarded] != "discarded by alice (a test line) edited false" {
		t.Fatalf("dead letters as the API has them: %v", got)
	}
}

// watchConsole collects the page's console errors and uncaught exceptions.
func watchConsole(t *testing.T, ctx context.Context) func() []string {
	t.Helper()
	var mu sync.Mutex
	var errs []string
	err := chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
				var args []string
				for _, a := range ev.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				errs = append(errs, "console."+string(ev.Type)+": "+strings.Join(args, " "))
			}
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			errs = append(errs, fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber+1, msg))
		}
	})
	if err != nil {
		t.Fatalf("listen to the page: %v", err)
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string{}, errs...)
	}
}

// click clicks the first element matching sel once it is visible.
func click(t *testing.T, ctx context.Context, sel string) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, chromedp.Click(chromedp.CSS(sel), chromedp.NodeVisible)); err != nil {
		t.Fatalf("click %s: %v", sel, err)
	}
}

// waitJS waits until the expression is true on the live page.
func waitJS(t *testing.T, ctx context.Context, js string) {
	t.Helper()
	wait(t, 20*time.Second, func() error {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
		if err == nil && !ok {
			err = fmt.Errorf("not yet: %s", js)
		}
		return err
	})
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// browser starts headless Chromium for the test and returns a tab's context.
func browser(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-dev-shm-usage", true), // /dev/shm is small in containers
		chromedp.Flag("window-size", "1400,900"),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start %s: %v", chromiumPath, err)
	}
	return bctx
}

// waitText waits until the first element matching sel has text containing
// want. It reads the live page: no reload.
func waitText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	waitTextUntil(t, ctx, time.Now().Add(20*time.Second), sel, want)
}

// waitTextUntil is waitText with a deadline (testutil.Wait's polling).
func waitTextUntil(t *testing.T, ctx context.Context, deadline time.Time, sel, want string) {
	t.Helper()
	q, _ := json.Marshal(sel)
	js := fmt.Sprintf(`(document.querySelector(%s) || {}).textContent || ""`, q)
	testutil.Wait(t, time.Until(deadline), func() error {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if err == nil && strings.Contains(got, want) {
			return nil
		}
		return fmt.Errorf("%s shows %q (%v), want %q by %v", sel, got, err, want, deadline.Format("15:04:05.000"))
	})
}

// freePort returns a loopback port nothing listens on (as of now).
func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

func httpOK(url string) error {
	res, err := http.Get(url)
	if err != nil {
		return err
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, res.Status)
	}
	return nil
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}
