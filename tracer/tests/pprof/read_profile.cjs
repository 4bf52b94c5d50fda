// Reads a gzipped pprof profile with Datadog's `pprof-format` (a third party's decoder of
// google/pprof's profile.proto) and prints, as JSON, what a pprof viewer would show:
// each sample type's flat value per leaf location (`FILE:LINE`, or the function's name
// where it has no file) and its total.
// Usage: node read_profile.cjs PPROF_FORMAT_PACKAGE_DIR PROFILE.pb.gz
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const { Profile } = require(path.join(process.argv[2], 'dist/commonjs/index.js'));

const profile = Profile.decode(zlib.gunzipSync(fs.readFileSync(process.argv[3])));
const strings = profile.stringTable.strings;
const text = (index) => strings[Number(index)];
const functions = new Map(profile.function.map((f) => [String(f.id), f]));
const locations = new Map(profile.location.map((l) => [String(l.id), l]));
const types = profile.sampleType.map((t) => text(t.type));
const flat = {};
const total = {};
for (const type of types) {
  flat[type] = {};
  total[type] = 0;
}
for (const sample of profile.sample) {
  const leaf = locations.get(String(sample.locationId[0]));
  const line = leaf.line[0];
  const fn = functions.get(String(line.functionId));
  const file = text(fn.filename);
  const name = file ? `${file}:${Number(line.line)}` : text(fn.name);
  sample.value.forEach((value, index) => {
    const type = types[index];
    flat[type][name] = (flat[type][name] || 0) + Number(value);
    total[type] += Number(value);
  });
}
console.log(JSON.stringify({
  sample_types: profile.sampleType.map((t) => [text(t.type), text(t.unit)]),
  default_sample_type: text(profile.defaultSampleType),
  flat,
  total,
}));
