package bench

import (
	"math"
	"slices"
)

// percentile returns the nearest-rank p-quantile of values (0 for none).
func percentile(values []float64, p float64) float64 {
	if len(values) == 0 {
		return 0
	}
	sorted := slices.Sorted(slices.Values(values))
	rank := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(rank, len(sorted)-1))]
}

// Spread is a figure over the rounds: its min, median and max.
type Spread struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// spread returns nil for no values; the median of an even count is the mean of the middle two.
func spread(values []float64) *Spread {
	if len(values) == 0 {
		return nil
	}
	s := slices.Sorted(slices.Values(values))
	n := len(s)
	return &Spread{Min: s[0], Median: (s[(n-1)/2] + s[n/2]) / 2, Max: s[n-1], N: n}
}

// ratio returns num/den, and false when den is not positive.
func ratio(num, den float64) (float64, bool) {
	if den <= 0 {
		return 0, false
	}
	return num / den, true
}
