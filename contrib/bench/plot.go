package main

import (
	"bytes"
	"image/color"

	"golang.org/x/perf/benchmath"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// plotRow is a ratio and the A/A pair's of one metric, and the target's limit (0: none).
type plotRow struct {
	label     string
	ratio, aa *benchmath.Summary
	limit     float64
}

// ratioPlot draws a row per metric, top down: the A/A pair's 95% interval as a grey band, the
// ratio's median as a dot on its 95% interval, the limit as a red mark, and a dashed line at 1.
func ratioPlot(title string, rows []plotRow) ([]byte, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "ratio"
	labels := make([]string, len(rows))
	add := func(xys plotter.XYs, style func(*plotter.Line)) error {
		l, err := plotter.NewLine(xys)
		if err == nil {
			style(l)
			p.Add(l)
		}
		return err
	}
	for k, row := range rows {
		y := float64(len(rows) - 1 - k)
		labels[len(rows)-1-k] = row.label
		var err error
		if finite(row.aa) {
			var band *plotter.Polygon
			band, err = plotter.NewPolygon(plotter.XYs{{X: row.aa.Lo, Y: y - 0.35}, {X: row.aa.Hi, Y: y - 0.35},
				{X: row.aa.Hi, Y: y + 0.35}, {X: row.aa.Lo, Y: y + 0.35}})
			if err == nil {
				band.Color, band.LineStyle.Width = color.Gray{Y: 215}, 0
				p.Add(band)
			}
		}
		if err == nil && row.limit > 0 {
			err = add(plotter.XYs{{X: row.limit, Y: y - 0.45}, {X: row.limit, Y: y + 0.45}}, func(l *plotter.Line) {
				l.Color, l.Width = color.RGBA{R: 200, A: 255}, vg.Points(1.5)
			})
		}
		if err == nil && finite(row.ratio) {
			err = add(plotter.XYs{{X: row.ratio.Lo, Y: y}, {X: row.ratio.Hi, Y: y}}, func(l *plotter.Line) { l.Width = vg.Points(1.5) })
		}
		if err == nil && row.ratio != nil {
			var dot *plotter.Scatter
			if dot, err = plotter.NewScatter(plotter.XYs{{X: row.ratio.Center, Y: y}}); err == nil {
				p.Add(dot)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if len(labels) == 0 {
		labels = []string{"(not measured)"}
	}
	if err := add(plotter.XYs{{X: 1, Y: -0.5}, {X: 1, Y: float64(len(labels)) - 0.5}}, func(l *plotter.Line) {
		l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
	}); err != nil {
		return nil, err
	}
	p.NominalY(labels...)
	w, err := p.WriterTo(20*vg.Centimeter, vg.Length(len(labels))*0.6*vg.Centimeter+3*vg.Centimeter, "svg")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	_, err = w.WriteTo(&b)
	return b.Bytes(), err
}
