package spread

import "testing"

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		vals []float64
		want string
	}{
		{nil, "-"},
		{[]float64{1.25}, "1.2"},
		{[]float64{3, 1, 2}, "2.0 (1.0–3.0)"},
		{[]float64{4, 1, 2, 3}, "2.5 (1.0–4.0)"},
	} {
		if got := Format(tc.vals, "%.1f"); got != tc.want {
			t.Errorf("Format(%v) = %q, want %q", tc.vals, got, tc.want)
		}
	}
}

func TestMedian(t *testing.T) {
	vals := []float64{4, 1, 3}
	if got := Median(vals); got != 3 {
		t.Errorf("Median(4, 1, 3) = %v, want 3", got)
	}
	if vals[0] != 4 {
		t.Errorf("Median sorted its argument: %v", vals)
	}
	if got := Median([]float64{2, 1}); got != 1.5 {
		t.Errorf("Median(2, 1) = %v, want 1.5", got)
	}
	if got := Median(nil); got != 0 {
		t.Errorf("Median() = %v, want 0", got)
	}
}
