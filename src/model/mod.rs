//! The one canonical representation of rules; every comparison goes through its equality.
