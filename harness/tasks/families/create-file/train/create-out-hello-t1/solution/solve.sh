#!/bin/bash
echo hello > /app/out.txt
