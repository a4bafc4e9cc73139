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
)

// chromiumPath is where .ci/run installs Chromium.
const chromiumPath = "/usr/bin/chromium"

// TestBrowser_Dashboard opens the dashboard of the real binary in headless
// Chromium and watches it follow the server without a reload: positions
// and rates as lines are appended; the red badge within two seconds of a
// loss; a dead letter requeued with the admin token, which the test reads
// back from the API; the losses acknowledged with the same token, asked
// for once; the readiness banner naming a stalled feed and clearing once it
// recovers. The page logs no console error or exception throughout.
func TestBrowser_Dashboard(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no %s (install chromium to run the browser test): %v", chromiumPath, err)
		}
		t.Fatalf("CI is set but %s is missing: %v", chromiumPath, err)
	}
	dir := t.TempDir()
	input, stuck := filepath.Join(dir, "ledger.csv"), filepath.Join(dir, "stuck.csv")
	failFlag, tokenFile := filepath.Join(dir, "fail-commits"), filepath.Join(dir, "token")
	const token = "dashboard-test-token-0123456789"
	// A line over --max-line 16 is a dead letter keeping the line's first 16
	// bytes: here a ledger line of its own, which the ledger applies once
	// requeued.
	const longLine, kept = "acct-9,100000000777\n", "acct-9,100000000"
	lines := "acct-1,10\nacct-2,5\njunk\n" + longLine
	for path, body := range map[string]string{input: lines, stuck: "", tokenFile: token} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr := "127.0.0.1:" + freePort(t)
	base := "http://" + addr
	start(t, []string{"OUTBOXD_TEST_FAIL_COMMITS=" + failFlag},
		"--db", filepath.Join(dir, "outboxd.db"), "--relay", "none", "--http", addr, "--admin-token-file", tokenFile,
		"--max-line", "16", "--feed", "ledger=file:"+input, "--processor", "ledger=ledger", "--on-completion-failure", "ledger=skip",
		"--feed", "stuck=file:"+stuck, "--feed", "later=file:"+filepath.Join(dir, "later.csv"))
	wait(t, 15*time.Second, func() error { return httpOK(base + "/readyz") })

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	ctx = browser(t, ctx)
	consoleErrors := watchConsole(t, ctx)
	row := `tr.feed[data-feed="ledger"]`

	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/")); err != nil {
		t.Fatalf("open the dashboard: %v", err)
	}
	pos := len(lines)
	waitText(t, ctx, row+" td.position", fmt.Sprintf("%d / %d", pos, pos))
	waitText(t, ctx, "#health-title", "ready")
	waitText(t, ctx, `tr.feed[data-feed="later"] td.state`, "waiting for its source")
	// A mark on the page: a reload would wipe it.
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.outboxdMark = "still here"`)); err != nil {
		t.Fatal(err)
	}

	appendFile(t, input, "acct-3,7\n")
	pos += len("acct-3,7\n")
	waitText(t, ctx, row+" td.position", fmt.Sprintf("%d / %d", pos, pos))
	waitText(t, ctx, row+" td.lossless", "lossless")
	waitText(t, ctx, "#rate-graph", "max") // the graph is drawn
	waitJS(t, ctx, `document.querySelectorAll("#rate-graph polyline.ingest").length === 1`)

	// The next 5 commits fail: every try of the next batch (5 by default),
	// a completion failure, skipped under policy skip.
	writeFile(t, failFlag, "5")
	appendFile(t, input, "acct-4,1\n")
	lostFrom, lostTo := pos, pos+len("acct-4,1\n")
	pos = lostTo
	var lostAt time.Time
	wait(t, 30*time.Second, func() error {
		var st struct{ Lossless bool }
		if err := getJSON(base+"/feeds/ledger/status", &st); err != nil {
			return err
		}
		if st.Lossless {
			return errors.New("the API still says lossless")
		}
		lostAt = time.Now()
		return nil
	})
	waitTextUntil(t, ctx, lostAt.Add(2*time.Second), row+" .badge.lossy", "NOT LOSSLESS")
	waitText(t, ctx, row+" ul.losses li", "completion failure skipped")
	waitText(t, ctx, row+" ul.losses li", fmt.Sprintf("partition 0, %d–%d", lostFrom, lostTo))

	requeueFromPage(t, ctx, base, token, kept)
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	shot := filepath.Join(t.ArtifactDir(), "dashboard.png")
	if p := os.Getenv("OUTBOXD_DASHBOARD_SCREENSHOT"); p != "" {
		shot = p // README's picture: OUTBOXD_DASHBOARD_SCREENSHOT=$PWD/../docs/dashboard.png
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("dashboard screenshot: %s", shot)

	// The token is asked for once: acknowledging uses it without a prompt.
	click(t, ctx, "#ack-losses")
	waitText(t, ctx, "#action-result", "losses of ledger acknowledged")
	waitText(t, ctx, row+" td.lossless", "lossless")
	if hidden, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("token").hidden`)); err != nil || !hidden {
		t.Fatalf("the token was asked for again (hidden %v, %v)", hidden, err)
	}
	var st struct{ Lossless bool }
	if err := getJSON(base+"/feeds/ledger/status", &st); err != nil || !st.Lossless {
		t.Fatalf("the API says lossless %v (%v) after the acknowledgement", st.Lossless, err)
	}

	// 8 failing commits stall the stuck feed (policy stop): 5 tries of its
	// batch, then retries 1s, 2s and 4s later; the next one goes through.
	writeFile(t, failFlag, "8")
	appendFile(t, stuck, "x\n")
	waitText(t, ctx, "#health-title", "NOT READY")
	waitText(t, ctx, "#health-reasons", "feed:stuck: stalled")
	waitText(t, ctx, `tr.feed[data-feed="stuck"] td.state`, "STALLED")
	waitText(t, ctx, "#health-title", "ready")
	waitText(t, ctx, `tr.feed[data-feed="stuck"] td.position`, "2 / 2")

	mark, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.outboxdMark || ""`))
	if err != nil || mark != "still here" {
		t.Fatalf("the page was reloaded (mark %q, %v): it must update itself", mark, err)
	}
	if errs := consoleErrors(); len(errs) > 0 {
		t.Fatalf("the page logged errors:\n%s", strings.Join(errs, "\n"))
	}
}

// requeueFromPage opens the ledger feed's detail, finds the dead letter
// whose payload is payload, clicks its requeue button, gives the token
// when the page asks for it, and checks through the API that the dead
// letter was requeued and its line applied.
func requeueFromPage(t *testing.T, ctx context.Context, base, token, payload string) {
	t.Helper()
	var before struct{ Applied int64 }
	if err := getJSON(base+"/feeds/ledger/status", &before); err != nil {
		t.Fatal(err)
	}
	click(t, ctx, `button.open-feed[data-feed="ledger"]`)
	waitText(t, ctx, "#detail-topics", "ledger.out, ledger.dlq")
	waitText(t, ctx, "#dead-letters tbody", payload)
	waitText(t, ctx, "#dead-letters tbody", "line-too-long")
	waitText(t, ctx, "#detail-losses", "completion failure skipped")
	q, _ := json.Marshal(payload)
	var id string
	wait(t, 10*time.Second, func() (err error) {
		id, err = chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(() => {
			const tr = [...document.querySelectorAll("#dead-letters tr.dead-letter")].find((r) => r.querySelector("td.payload").textContent === %s);
			return tr ? tr.dataset.id : "";
		})()`, q)))
		if err == nil && id == "" {
			err = errors.New("no dead letter row with the payload")
		}
		return err
	})
	click(t, ctx, fmt.Sprintf(`#dead-letters tr.dead-letter[data-id="%s"] button.requeue`, id))
	waitJS(t, ctx, `!document.getElementById("token").hidden`)
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#token-input"), token)); err != nil {
		t.Fatal(err)
	}
	click(t, ctx, "#token-use")
	waitText(t, ctx, "#action-result", "dead letter "+id+" of ledger requeued")
	waitText(t, ctx, fmt.Sprintf(`#dead-letters tr.dead-letter[data-id="%s"] td.action`, id), "requeued")
	stored, err := chromedp.Run(ctx, chromedp.Evaluate[string](`sessionStorage.getItem("outboxd.adminToken") + "|" + localStorage.length`))
	if err != nil || stored != token+"|0" {
		t.Fatalf("storage %q (%v): the token belongs in sessionStorage only", stored, err)
	}

	var page struct {
		DeadLetters []struct {
			ID         int64
			Payload    string
			RequeuedAt *time.Time
		}
	}
	if err := getJSON(base+"/feeds/ledger/dead-letters", &page); err != nil {
		t.Fatal(err)
	}
	var requeued []string
	for _, dl := range page.DeadLetters {
		if dl.RequeuedAt != nil {
			requeued = append(requeued, fmt.Sprintf("%d:%s", dl.ID, dl.Payload))
		}
	}
	if want := id + ":" + payload; len(requeued) != 1 || requeued[0] != want {
		t.Fatalf("requeued dead letters %q, want only %q", requeued, want)
	}
	var after struct{ Applied int64 }
	if err := getJSON(base+"/feeds/ledger/status", &after); err != nil || after.Applied != before.Applied+1 {
		t.Fatalf("applied %d (%v), want %d: the requeued line applied once", after.Applied, err, before.Applied+1)
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

// waitTextUntil is waitText with a deadline, polling every 20 ms.
func waitTextUntil(t *testing.T, ctx context.Context, deadline time.Time, sel, want string) {
	t.Helper()
	q, _ := json.Marshal(sel)
	js := fmt.Sprintf(`(document.querySelector(%s) || {}).textContent || ""`, q)
	for {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if err == nil && strings.Contains(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s shows %q (%v), want %q by %v", sel, got, err, want, deadline.Format("15:04:05.000"))
		}
		time.Sleep(20 * time.Millisecond)
	}
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
