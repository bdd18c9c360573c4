//! The tenant settings and readings every front-end offers, written once:
//! [`key_settings!`] for the builders (`per_key_cap`, `key_weight`,
//! `key_cap`, `fair_line`, into a `keys: KeySettings` field) and
//! [`key_readings!`] for the front-ends (`key_usage`, `key_weight`,
//! `set_key_weight`, `set_key_cap`, over their table). Each takes the
//! lines that build the front-end in its doc examples.

/// The builder methods of tenant keys, for a builder with a
/// `keys: KeySettings` field. `$make` is a doc example's expression of a
/// builder with a capacity, `$build` the call that builds it.
macro_rules! key_settings {
    (setup: $setup:literal, make: $make:literal, build: $build:literal) => {
        /// The most units one tenant may hold at once (requests asked with
        /// [`Ask::key`](crate::engine::ask::Ask::key)), unless it has a cap of its
        /// own ([`key_cap`](Self::key_cap)). Default: none, the capacity
        /// bounds it. A request that would take its tenant past its cap is
        /// refused with [`Error::KeyBusy`](crate::error::Error::KeyBusy) (a waiting
        /// one too: it does not wait for its tenant's units); one of more
        /// units than the cap with [`Error::TooLarge`](crate::error::Error::TooLarge).
        /// The guide's page on fairness says more.
        ///
        /// Checked at build: a [`ConfigError`](crate::error::ConfigError) naming
        /// `per_key_cap` for 0.
        ///
        /// # Examples
        ///
        #[doc = concat!("```\n", $setup, "let err = ", $make, ".per_key_cap(0)", $build, ".unwrap_err();\nassert_eq!(err.field(), \"per_key_cap\");\n```")]
        pub fn per_key_cap(&mut self, units: usize) -> &mut Self {
            self.keys.per_key_cap = Some(units);
            self
        }

        /// Tenant `key`'s weight in the fair share (default 1): while the
        /// capacity binds, a tenant is entitled to `capacity × weight / W`
        /// units, `W` the weight of every tenant that holds units, and a
        /// waiting room serves it in proportion to its weight. Settable at
        /// run time with `set_key_weight`. Name the tenant as its requests
        /// do: a `&str` and a `String` are one tenant, a `&[u8]` another.
        ///
        /// Checked at build: a [`ConfigError`](crate::error::ConfigError) naming
        /// `key_weight` for 0.
        ///
        /// # Examples
        ///
        #[doc = concat!("```\n", $setup, "let front = ", $make, ".key_weight(\"gold\", 5)", $build, "?;\nassert_eq!((front.key_weight(\"gold\"), front.key_weight(\"free\")), (5, 1));\n# Ok::<(), Box<dyn std::error::Error>>(())\n```")]
        pub fn key_weight<K: std::hash::Hash + ?Sized>(&mut self, key: &K, weight: u32) -> &mut Self {
            self.keys
                .rules
                .push((crate::engine::keys::id_of(key), crate::engine::keys::Rule::Weight(weight)));
            self
        }

        /// Tenant `key`'s own cap, in place of
        /// [`per_key_cap`](Self::per_key_cap): the most units it may hold at
        /// once. Settable at run time with `set_key_cap`.
        ///
        /// Checked at build: a [`ConfigError`](crate::error::ConfigError) naming
        /// `key_cap` for 0.
        ///
        /// # Examples
        ///
        #[doc = concat!("```\n", $setup, "let err = ", $make, ".key_cap(\"batch\", 0)", $build, ".unwrap_err();\nassert_eq!(err.field(), \"key_cap\");\n```")]
        pub fn key_cap<K: std::hash::Hash + ?Sized>(&mut self, key: &K, units: usize) -> &mut Self {
            self.keys
                .rules
                .push((crate::engine::keys::id_of(key), crate::engine::keys::Rule::Cap(units)));
            self
        }

        /// The fair line: the fraction of the capacity that a fail-fast
        /// request of a tenant *over* its fair share may fill. Above it,
        /// units are kept for tenants within their share, so a tenant that
        /// floods leaves room for the others to get in without waiting.
        /// Default 0.9; 1 keeps nothing back. Requests that wait in a
        /// waiting room are served in the fair order instead, and do not
        /// stop at the line.
        ///
        /// Checked at build: a [`ConfigError`](crate::error::ConfigError) naming
        /// `fair_line` for a fraction outside (0, 1] (or not a number).
        ///
        /// # Examples
        ///
        #[doc = concat!("```\n", $setup, "let err = ", $make, ".fair_line(1.5)", $build, ".unwrap_err();\nassert_eq!(err.field(), \"fair_line\");\n```")]
        pub fn fair_line(&mut self, fraction: f64) -> &mut Self {
            self.keys.fair_line = Some(fraction);
            self
        }
    };
}
pub(crate) use key_settings;

/// The front-end methods of tenant keys, over the table at
/// `self.$($field).+`. `$make` is a doc example's statement that makes the
/// front-end, `front`.
macro_rules! key_readings {
    ($($field:ident).+ ; setup: $setup:literal, make: $make:literal, end: $end:literal) => {
        /// The units tenant `key` holds now (requests asked with
        /// [`Ask::key`](crate::engine::ask::Ask::key); those a waiting request
        /// waits for count from the moment it asks).
        ///
        /// # Examples
        ///
        #[doc = concat!("```\n", $setup, $make, "\nassert_eq!(front.key_usage(\"tenant-a\"), 0);\n", $end, "```")]
        pub fn key_usage<K: std::hash::Hash + ?Sized>(&self, key: &K) -> usize {
            self.$($field).+.key_usage(key)
        }

        /// Tenant `key`'s weight in the fair share: its own, or 1.
        ///
        /// # Examples
        ///
        #[doc = concat!("```\n", $setup, $make, "\nassert_eq!(front.key_weight(\"tenant-a\"), 1);\n", $end, "```")]
        pub fn key_weight<K: std::hash::Hash + ?Sized>(&self, key: &K) -> u32 {
            self.$($field).+.keys().weight(crate::engine::keys::id_of(key))
        }

        /// Sets tenant `key`'s weight in the fair share from now on: if it
        /// holds units, the shares move at once. Its rule (its weight and
        /// cap) is kept from then on.
        ///
        /// # Errors
        ///
        /// A [`ConfigError`](crate::error::ConfigError) naming `key_weight` for 0.
        ///
        /// # Examples
        ///
        #[doc = concat!("```\n", $setup, $make, "\nfront.set_key_weight(\"gold\", 4)?;\nassert_eq!(front.key_weight(\"gold\"), 4);\nassert_eq!(front.set_key_weight(\"gold\", 0).unwrap_err().field(), \"key_weight\");\n", $end, "```")]
        pub fn set_key_weight<K: std::hash::Hash + ?Sized>(
            &self,
            key: &K,
            weight: u32,
        ) -> Result<(), crate::error::ConfigError> {
            self.$($field).+.set_key_rule(key, crate::engine::keys::Rule::Weight(weight))
        }

        /// Sets tenant `key`'s own cap from now on: a tenant above a
        /// lowered cap keeps what it holds and takes no more until it is
        /// under it.
        ///
        /// # Errors
        ///
        /// A [`ConfigError`](crate::error::ConfigError) naming `key_cap` for 0.
        ///
        /// # Examples
        ///
        #[doc = concat!("```\n", $setup, $make, "\nfront.set_key_cap(\"batch\", 2)?;\nassert_eq!(front.set_key_cap(\"batch\", 0).unwrap_err().field(), \"key_cap\");\n", $end, "```")]
        pub fn set_key_cap<K: std::hash::Hash + ?Sized>(
            &self,
            key: &K,
            units: usize,
        ) -> Result<(), crate::error::ConfigError> {
            self.$($field).+.set_key_rule(key, crate::engine::keys::Rule::Cap(units))
        }
    };
}
pub(crate) use key_readings;
