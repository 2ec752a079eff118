package bench

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
	p.Title.Text, p.X.Label.Text = title, "ratio"
	labels := make([]string, max(len(rows), 1))
	labels[0] = "(not measured)" // replaced by the last row's label, if any
	var shapes []plot.Plotter
	line := func(x0, y0, x1, y1 float64, width vg.Length, c color.Color, dashes ...vg.Length) {
		l, _ := plotter.NewLine(plotter.XYs{{X: x0, Y: y0}, {X: x1, Y: y1}}) // two finite points: no error
		l.Width, l.Color, l.Dashes = width, c, dashes
		shapes = append(shapes, l)
	}
	for k, row := range rows {
		y := float64(len(rows) - 1 - k)
		labels[int(y)] = row.label
		if finite(row.aa) {
			line(row.aa.Lo, y, row.aa.Hi, y, vg.Points(9), color.Gray{Y: 215})
		}
		if row.limit > 0 {
			line(row.limit, y-0.45, row.limit, y+0.45, vg.Points(1.5), color.RGBA{R: 200, A: 255})
		}
		if finite(row.ratio) {
			line(row.ratio.Lo, y, row.ratio.Hi, y, vg.Points(1.5), color.Black)
		}
		if row.ratio != nil {
			dot, err := plotter.NewScatter(plotter.XYs{{X: row.ratio.Center, Y: y}})
			if err != nil {
				return nil, err
			}
			shapes = append(shapes, dot)
		}
	}
	line(1, -0.5, 1, float64(len(labels))-0.5, vg.Points(0.5), color.Black, vg.Points(3), vg.Points(3))
	p.Add(shapes...)
	p.NominalY(labels...)
	w, err := p.WriterTo(20*vg.Centimeter, vg.Length(len(labels))*0.6*vg.Centimeter+3*vg.Centimeter, "svg")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	_, err = w.WriteTo(&b)
	return b.Bytes(), err
}
