"""The certificate file format: what a certified run publishes (release/certificate.json, the weights) and
keeps private (private/audit.json), its format, writing, reading, hashing and the checks anyone can run on
it without trusting it. The mathematics those checks recompute lives in certified/maths/."""
