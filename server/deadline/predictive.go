package deadline

import "math"

// The predictive distributions of the expected-loss policy: a few support
// points each, built from the bounded histories at every decision. Fixed
// arrays keep a decision free of allocation and its cost bounded.

// maxSupport fits the largest distribution, D = C + R: 8 × 8 points.
const maxSupport = saveBody * saveBody

// support is a discrete distribution: values v[:n] with probabilities p[:n].
// After seal, the values are sorted and cumP/cumPV hold the prefix sums of p
// and p·v, so that P(X ≤ y) and E[X; X ≤ y] take one binary search.
type support struct {
	v, p, cumP, cumPV [maxSupport + 1]float64
	n                 int
}

func (s *support) add(v, p float64) {
	s.v[s.n], s.p[s.n] = v, p
	s.n++
}

// seal sorts the points by value (insertion sort: at most 64 points, mostly
// in order already) and computes the prefix sums; cumP[k] is the
// probability of the k smallest points.
func (s *support) seal() {
	for i := 1; i < s.n; i++ {
		for j := i; j > 0 && s.v[j] < s.v[j-1]; j-- {
			s.v[j], s.v[j-1] = s.v[j-1], s.v[j]
			s.p[j], s.p[j-1] = s.p[j-1], s.p[j]
		}
	}
	s.cumP[0], s.cumPV[0] = 0, 0
	for i := 0; i < s.n; i++ {
		s.cumP[i+1] = s.cumP[i] + s.p[i]
		s.cumPV[i+1] = s.cumPV[i] + s.p[i]*s.v[i]
	}
}

// upTo returns P(X ≤ y) and E[X; X ≤ y].
func (s *support) upTo(y float64) (prob, partialMean float64) {
	lo, hi := 0, s.n // the first point above y is in [lo, hi]
	for lo < hi {
		mid := (lo + hi) / 2
		if s.v[mid] > y {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return s.cumP[lo], s.cumPV[lo]
}

func (s *support) lo() float64   { return s.v[0] }
func (s *support) mean() float64 { return s.cumPV[s.n] }
func (s *support) hi() float64   { return s.v[s.n-1] }

// Iteration model: the recent iterations, as they are, stand for the next
// one; one more point at tailFactor × the longest covers a slower one than
// any seen. A drift (iterations slowing down over the run) scales them all
// by how much slower the latest few are than the window.
const (
	tailFactor   = 1.1
	driftRecent  = 8
	driftMinimum = 16 // fewer iterations than this: no drift estimate
	driftFloor   = 0.8
	driftCeiling = 1.5
)

// iterationDist is the predictive distribution of the next iteration; r
// must hold at least one value.
func iterationDist(r *Ring) support {
	var s support
	n := r.Len()
	scale := drift(r)
	w := 1 / float64(n+1)
	longest := 0.0
	for i := range n {
		v := r.At(i) * scale
		s.add(v, w)
		longest = math.Max(longest, v)
	}
	s.add(tailFactor*longest, w)
	s.seal()
	return s
}

// drift is median(latest driftRecent) / median(all), clamped: the medians
// ignore the odd slow step (and the first one, often twice as long).
func drift(r *Ring) float64 {
	n := r.Len()
	if n < driftMinimum {
		return 1
	}
	var all, recent [RingCapacity]float64
	for i := range n {
		all[i] = r.At(i)
	}
	copy(recent[:], all[n-driftRecent:n])
	whole := lowerMedian(all[:n])
	if whole <= 0 {
		return 1
	}
	return min(max(lowerMedian(recent[:driftRecent])/whole, driftFloor), driftCeiling)
}

// lowerMedian sorts vs in place and returns its lower median.
func lowerMedian(vs []float64) float64 {
	for i := 1; i < len(vs); i++ {
		for j := i; j > 0 && vs[j] < vs[j-1]; j-- {
			vs[j], vs[j-1] = vs[j-1], vs[j]
		}
	}
	return vs[(len(vs)-1)/2]
}

// Save model (C and R alike): a lognormal body of saveBody-1 equally likely
// points around the level (the lower median of the window), and a "stall"
// point: saves that hang on a slow file system or a straggler rank. A
// duration above stallRatio × the level is a stall, one below the level /
// stallRatio is left out of the spread; the stall probability
// starts at stallPrior and learns from the stalls in the window, weighted
// as if the prior had been stallPriorWeight observations.
const (
	saveBody         = 8 // support points of C or R, the stall point included
	minLogSpread     = 0.25
	stallRatio       = 1.6
	stallPrior       = 0.05
	stallPriorWeight = 4
	stallFactor      = 2.5
)

// bodyQuantiles are Φ⁻¹((i + 0.5) / 7), i = 0..6: seven equally likely
// points of a standard normal.
var bodyQuantiles = [saveBody - 1]float64{
	-1.4652337926855223, -0.7916386077433746, -0.36610635680056963, 0,
	0.36610635680056963, 0.7916386077433746, 1.4652337926855223,
}

// saveModel summarises a save's history: the parameters of its predictive
// distribution, kept apart so that tests and explanations can name them.
type saveModel struct {
	level, spread, pStall, stall float64
	measured                     int
}

// modelSave fits the save model to the window, or to the prior while
// nothing is measured (a measured duration, however small, replaces it).
func modelSave(r *Ring, prior float64) saveModel {
	n := r.Len()
	if n == 0 {
		return saveModel{level: prior, spread: minLogSpread, pStall: stallPrior, stall: stallFactor * prior}
	}
	var vs [RingCapacity]float64
	for i := range n {
		vs[i] = r.At(i)
	}
	m := saveModel{level: lowerMedian(vs[:n]), measured: n}
	if m.level <= 0 {
		return saveModel{measured: n, pStall: stallPrior}
	}
	stalls, body, sq, worst := 0, 0, 0.0, stallFactor
	for _, v := range vs[:n] {
		ratio := v / m.level
		switch {
		case ratio > stallRatio:
			stalls++
			worst = math.Max(worst, ratio)
		case ratio >= 1/stallRatio:
			body++
			sq += math.Log(ratio) * math.Log(ratio)
		}
		// A save far faster than the level (a snapshot with little to
		// save) says nothing about how long one can take: counted in
		// the spread, it would widen the body upwards too.
	}
	m.spread = math.Max(minLogSpread, math.Sqrt(sq/float64(body)))
	m.pStall = max(stallPrior, (stallPrior*stallPriorWeight+float64(stalls))/(stallPriorWeight+float64(n)))
	m.stall = worst * m.level
	return m
}

// dist is the model's predictive distribution.
func (m saveModel) dist() support {
	var s support
	if m.level <= 0 {
		s.add(0, 1)
		s.seal()
		return s
	}
	w := (1 - m.pStall) / float64(len(bodyQuantiles))
	for _, z := range bodyQuantiles {
		s.add(m.level*math.Exp(m.spread*z), w)
	}
	s.add(m.stall, m.pStall)
	s.seal()
	return s
}

// convolve is the distribution of X + Y for independent X and Y.
func convolve(x, y *support) support {
	var s support
	for i := range x.n {
		for j := range y.n {
			s.add(x.v[i]+y.v[j], x.p[i]*y.p[j])
		}
	}
	s.seal()
	return s
}
