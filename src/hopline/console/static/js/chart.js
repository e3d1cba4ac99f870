// A byte axis on a log scale, shared by the budget chain and the frame histogram
// (plain SVG and CSS drawn here: no charting library).

import { human } from './format.js';

/** Powers of two around [min, max]; `at(v)` maps bytes to [0, 1] on a log2 scale. */
export function logAxis(min, max) {
  const lo = Math.max(0, Math.floor(Math.log2(Math.max(1, min))));
  const hi = Math.max(lo + 1, Math.ceil(Math.log2(Math.max(2, max))));
  return {
    lo: 2 ** lo,
    hi: 2 ** hi,
    at(value) {
      const v = Math.log2(Math.max(1, value));
      return Math.min(1, Math.max(0, (v - lo) / (hi - lo)));
    },
    /** Ticks at every `step`-th power of two (e.g. 2: 1 KiB, 4 KiB, 16 KiB, …). */
    ticks(step = 2) {
      const out = [];
      for (let e = Math.ceil(lo / step) * step; e <= hi; e += step) out.push({ value: 2 ** e, label: human(2 ** e) });
      return out;
    },
  };
}
