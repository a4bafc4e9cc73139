package bench

import (
	"fmt"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// writeSweepChart draws a sweep as an SVG (or PNG, by path's extension):
// lines/s of raw_sqlite and of ingest against the number of accounts, on a
// logarithmic axis.
func writeSweepChart(s *sweepResult, path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("outboxd ingest by state size (%d lines per point)", s.Lines)
	p.X.Label.Text = "accounts in the state"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Label.Text = "lines/s"
	p.Y.Min = 0
	raw, ing := make(plotter.XYs, 0, len(s.Points)), make(plotter.XYs, 0, len(s.Points))
	for _, pt := range s.Points {
		if pt.RawSQLite != nil {
			raw = append(raw, plotter.XY{X: float64(pt.Accounts), Y: pt.RawSQLite.PerSecond})
		}
		ing = append(ing, plotter.XY{X: float64(pt.Accounts), Y: pt.Ingest.PerSecond})
	}
	lines := []any{"ingest (the server)", ing}
	if len(raw) > 0 {
		lines = append([]any{"raw_sqlite (ceiling)", raw}, lines...)
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return fmt.Errorf("draw the sweep: %w", err)
	}
	p.Legend.Top = true
	if err := p.Save(8*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return fmt.Errorf("write the chart %s: %w", path, err)
	}
	return nil
}
