package server

import (
	"bytes"
	"fmt"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The live view's charts, drawn as SVG by gonum/plot from the ring of
// samples: the page only places them, so it needs no script library, and
// a chart is the same whoever draws it (a test reads the SVG it gets).
// The x axis is seconds before the latest sample.

// viewSeries is one line of a chart.
type viewSeries struct {
	name string
	xy   plotter.XYs
}

// viewChart is one chart: its title, its y axis and how its lines come
// from the samples (name names a device).
type viewChart struct {
	title, y string
	top      float64 // the y axis's top, if fixed (a percentage)
	lines    func(all []viewSample, name func(uint64) string) []viewSeries
}

// viewCharts are the charts by name, as /view/chart/NAME.svg serves them.
var viewCharts = map[string]viewChart{
	"samples": {title: "samples/s of each job", y: "samples/s", lines: func(all []viewSample, _ func(uint64) string) []viewSeries {
		return perJob(all, func(a, b viewSample, id string) (float64, bool) { return jobRate(a, b, id) })
	}},
	"position": {title: "each job's place: epoch and the fraction done of it", y: "epoch", lines: func(all []viewSample, _ func(uint64) string) []viewSeries {
		return perJob(all, func(_, b viewSample, id string) (float64, bool) {
			j, ok := findJob(b, id)
			if !ok || j.Subset <= 0 {
				return 0, false
			}
			return float64(j.Epoch) + float64(j.Position)/float64(j.Subset), true
		})
	}},
	"cache": {title: "record cache", y: "MB", lines: func(all []viewSample, _ func(uint64) string) []viewSeries {
		held, budget := viewSeries{name: "held"}, viewSeries{name: "budget"}
		last := all[len(all)-1].at
		for _, s := range all {
			x := s.at.Sub(last).Seconds()
			held.xy = append(held.xy, plotter.XY{X: x, Y: float64(s.status.Cache.Bytes) / 1e6})
			budget.xy = append(budget.xy, plotter.XY{X: x, Y: float64(s.status.Cache.Budget) / 1e6})
		}
		return []viewSeries{held, budget}
	}},
	"hits": {title: "record cache hit rate", y: "%", top: 100, lines: func(all []viewSample, _ func(uint64) string) []viewSeries {
		return []viewSeries{between(all, "hit rate", hitRate)}
	}},
	"devices": {title: "reads from each device", y: "MB/s", lines: func(all []viewSample, name func(uint64) string) []viewSeries {
		return perDevice(all, name, func(a, b viewSample, id uint64) (float64, bool) { return deviceRate(a, b, id) })
	}},
	"inflight": {title: "reads in flight on each device", y: "reads", lines: func(all []viewSample, name func(uint64) string) []viewSeries {
		return perDevice(all, name, func(_, b viewSample, id uint64) (float64, bool) {
			for _, d := range b.devices {
				if d.ID == id {
					return float64(d.Stats.InFlight), true
				}
			}
			return 0, false
		})
	}},
}

// between is a line of values each taken from a sample and the one before.
func between(all []viewSample, name string, f func(a, b viewSample) (float64, bool)) viewSeries {
	out := viewSeries{name: name}
	last := all[len(all)-1].at
	for i := 1; i < len(all); i++ {
		if y, ok := f(all[i-1], all[i]); ok {
			out.xy = append(out.xy, plotter.XY{X: all[i].at.Sub(last).Seconds(), Y: y})
		}
	}
	return out
}

// perJob is a line for each job that was open in the samples.
func perJob(all []viewSample, f func(a, b viewSample, id string) (float64, bool)) []viewSeries {
	var out []viewSeries
	for _, id := range jobIDs(all) {
		out = append(out, between(all, "job "+id, func(a, b viewSample) (float64, bool) { return f(a, b, id) }))
	}
	return out
}

// perDevice is a line for each device read in the samples.
func perDevice(all []viewSample, name func(uint64) string, f func(a, b viewSample, id uint64) (float64, bool)) []viewSeries {
	var ids []uint64
	seen := map[uint64]bool{}
	for _, s := range all {
		for _, d := range s.devices {
			if !seen[d.ID] {
				seen[d.ID] = true
				ids = append(ids, d.ID)
			}
		}
	}
	var out []viewSeries
	for _, id := range ids {
		out = append(out, between(all, name(id), func(a, b viewSample) (float64, bool) { return f(a, b, id) }))
	}
	return out
}

// render draws the chart of the samples as an SVG document.
func (c viewChart) render(all []viewSample, name func(uint64) string) ([]byte, error) {
	p := plot.New()
	p.Title.Text = c.title
	p.X.Label.Text = "seconds before now"
	p.Y.Label.Text = c.y
	p.Legend.Top, p.Legend.Left = true, true
	var lines []viewSeries
	if len(all) > 0 {
		for _, l := range c.lines(all, name) {
			if len(l.xy) > 0 { // a line with no points yet is no line
				lines = append(lines, l)
			}
		}
	}
	for i, l := range lines {
		line, err := plotter.NewLine(l.xy)
		if err != nil {
			return nil, fmt.Errorf("chart %s, line %s: %w", c.title, l.name, err)
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(l.name, line)
	}
	if len(lines) == 0 {
		p.Title.Text += " (no data yet)"
	}
	// The axes start at zero and span at least a minute, so that a chart
	// of a few samples, or of none, is still drawn to a sensible scale.
	p.X.Min = min(p.X.Min, -60)
	p.X.Max = 0
	p.Y.Min = 0
	p.Y.Max = max(p.Y.Max, 1)
	if c.top > 0 {
		p.Y.Max = c.top
	}
	// A margin on the right, where the last tick's label ("0") would
	// otherwise be cut in half by the edge.
	svg := vgsvg.New(6*vg.Inch, 3*vg.Inch)
	p.Draw(draw.Crop(draw.New(svg), 0, -vg.Points(8), 0, 0))
	var b bytes.Buffer
	if _, err := svg.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
